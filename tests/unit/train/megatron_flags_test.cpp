// Megatron-LM core_r0.10.0's flag table (train/megatron_flags.inc, generated from its parser)
// and `tessera train`'s option table against it: the same dests, kinds and defaults for the
// flags tessera implements (switches defaulting to None read None), and every other Megatron
// flag refused by name.
#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "tessera/core/error.h"
#include "tessera/core/options.h"
#include "tessera/train/arguments.h"
#include "tessera/train/megatron_flags.h"

namespace tessera {
namespace {

std::set<std::string> saved_namespace_attributes() {
  std::ifstream in(std::string(TESSERA_SOURCE_DIR) + "/tests/ckpt_area/megatron_namespace_dests.txt");
  std::set<std::string> out;
  for (std::string line; std::getline(in, line);)
    if (!line.empty() && line[0] != '#') out.insert(line);
  return out;
}

TEST(MegatronFlags, AreTheParsersOwn) {
  EXPECT_EQ(megatron_flags().size(), 379u);
  const MegatronFlag* fp8 = find_megatron_flag("--fp8-format");
  ASSERT_NE(fp8, nullptr);
  EXPECT_STREQ(fp8->dest, "fp8");  // not derived from the option string
  EXPECT_STREQ(find_megatron_flag("--disable-bias-linear")->dest, "add_bias_linear");
  // An alias has its own entry, writing the same attribute.
  EXPECT_STREQ(find_megatron_flag("--persistent-save-interval")->dest, "save_interval");
  EXPECT_STREQ(find_megatron_flag("--save-interval")->dest, "save_interval");
  EXPECT_EQ(find_megatron_flag("--data-path")->kind, MegatronFlagKind::List);
  EXPECT_EQ(find_megatron_flag("--no-position-embedding")->kind, MegatronFlagKind::Switch);
  EXPECT_STREQ(find_megatron_flag("--no-position-embedding")->default_literal, "True");  // store_false
  EXPECT_STREQ(find_megatron_flag("--initial-loss-scale")->default_literal, "4294967296");  // 2**32, evaluated
  EXPECT_STREQ(find_megatron_flag("--normalization")->default_literal, "'LayerNorm'");
  EXPECT_FALSE(is_megatron_flag("--rope-scaling-factor"));  // a later Megatron's
  EXPECT_FALSE(is_megatron_flag("--init-from-hf"));         // tessera's
}

// The two generated files agree: what a flag writes is an attribute of the saved Namespace,
// unless validate_args deletes it (its deprecated spellings, megatron/training/arguments.py).
TEST(MegatronFlags, DestsAreAttributesOfTheSavedNamespace) {
  const std::set<std::string> attributes = saved_namespace_attributes();
  ASSERT_GT(attributes.size(), 300u);
  const std::set<std::string> deleted = {"batch_size", "warmup", "model_parallel_size", "checkpoint_activations",
                                         "recompute_activations"};
  for (const MegatronFlag& f : megatron_flags())
    EXPECT_TRUE(attributes.count(f.dest) || deleted.count(f.dest)) << f.name << " writes " << f.dest;
}

// Whether tessera's default is the value of Megatron's (a number, or a string in Python's quotes).
bool same_default(const OptionDef& d, const MegatronFlag& f) {
  const std::string megatron = f.default_literal;
  if (!d.default_value) return megatron == "None";
  if (d.kind == OptKind::Int || d.kind == OptKind::Float || megatron.front() != '\'')
    return std::strtod(d.default_value, nullptr) == std::strtod(megatron.c_str(), nullptr);
  return megatron == "'" + std::string(d.default_value) + "'";
}

TEST(MegatronFlags, TrainTableAgreesWithTheParser) {
  int megatrons = 0;
  for (const OptionDef& d : train_option_table().defs()) {
    const MegatronFlag* f = find_megatron_flag(d.flag);
    if (!f) continue;
    ++megatrons;
    EXPECT_EQ(option_dest(d), f->dest) << d.flag;  // Megatron's argument dump and checkpoint Namespace
    switch (d.kind) {
      case OptKind::StoreTrue:  // default False, or None where Megatron writes default=None
        EXPECT_EQ(f->kind, MegatronFlagKind::Switch) << d.flag;
        EXPECT_STREQ(f->default_literal, d.default_value ? d.default_value : "False") << d.flag;
        break;
      case OptKind::StoreFalse:
        EXPECT_EQ(f->kind, MegatronFlagKind::Switch) << d.flag;
        EXPECT_STREQ(f->default_literal, "True") << d.flag;
        break;
      case OptKind::List: EXPECT_EQ(f->kind, MegatronFlagKind::List) << d.flag; break;
      default:
        EXPECT_EQ(f->kind, MegatronFlagKind::Value) << d.flag;
        // Megatron's --local-rank defaults to $LOCAL_RANK as parse_args reads it; tessera reads
        // LOCAL_RANK itself (launch/worker_env.cpp) and leaves the flag None.
        if (d.flag == std::string_view("--local-rank")) continue;
        EXPECT_TRUE(same_default(d, *f)) << d.flag << ": tessera " << (d.default_value ? d.default_value : "None")
                                         << ", Megatron " << f->default_literal;
    }
  }
  EXPECT_GT(megatrons, 100);
}

// Megatron's store_true switches with default=None (--no-save-optim, ...) read None until given,
// so the argument dump prints None as Megatron's does.
TEST(MegatronFlags, SwitchesDefaultingToNoneReadNone) {
  std::vector<std::string> args = {"--no-load-rng"};
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  const ParsedOptions p = train_option_table().parse(static_cast<int>(argv.size()), argv.data());
  EXPECT_EQ(p.raw("--no-save-optim"), std::nullopt);
  EXPECT_FALSE(p.get_bool("--no-save-optim"));
  EXPECT_EQ(p.raw("--no-load-rng"), "True");
  EXPECT_EQ(p.raw("--swiglu"), "False");  // store_true's own default
}

std::string train_error(std::vector<std::string> extra) {
  std::vector<std::string> args = {"--num-layers", "2", "--hidden-size", "32", "--num-attention-heads", "4",
                                   "--seq-length", "16", "--max-position-embeddings", "16", "--micro-batch-size",
                                   "1", "--tokenizer-type", "NullTokenizer", "--vocab-size", "99", "--mock-data",
                                   "--lr", "1e-3", "--train-iters", "1"};
  args.insert(args.end(), extra.begin(), extra.end());
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  try {
    parse_train_args(static_cast<int>(argv.size()), argv.data());
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

// Every Megatron flag tessera's table lacks is refused by name, with or without its value.
TEST(MegatronFlags, TrainRefusesTheOnesItLacksByName) {
  int refused = 0;
  for (const MegatronFlag& f : megatron_flags()) {
    bool in_table = false;
    for (const OptionDef& d : train_option_table().defs()) in_table |= f.name == std::string_view(d.flag);
    if (in_table) continue;
    std::vector<std::string> extra = {f.name};
    if (f.kind != MegatronFlagKind::Switch) extra.push_back("1");
    EXPECT_EQ(train_error(extra), std::string(f.name) + " is a Megatron-LM flag that tessera does not support yet");
    ++refused;
  }
  EXPECT_GT(refused, 100);
}

}  // namespace
}  // namespace tessera
