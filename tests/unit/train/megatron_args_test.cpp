// The Namespace tessera writes for Megatron-LM's checkpoints (train/megatron_args.h) against
// Megatron core_r0.10.0's own attribute list (tests/ckpt_area/megatron_namespace_dests.txt,
// from its parser): the same attributes, tessera's flags writing Megatron's dests, and the
// values loaders read for a GPT with biases and a Llama without.
#include <gtest/gtest.h>

#include <fstream>
#include <set>
#include <string>

#include "tessera/train/arguments.h"
#include "tessera/train/megatron_args.h"

namespace tessera {
namespace {

std::set<std::string> megatron_dests() {
  std::ifstream in(std::string(TESSERA_SOURCE_DIR) + "/tests/ckpt_area/megatron_namespace_dests.txt");
  std::set<std::string> out;
  for (std::string line; std::getline(in, line);)
    if (!line.empty() && line[0] != '#') out.insert(line);
  return out;
}

nlohmann::json namespace_of(std::vector<std::string> flags, int world_size = 1) {
  flags.insert(flags.end(), {"--num-layers", "2", "--hidden-size", "32", "--num-attention-heads", "4", "--seq-length",
                             "16", "--max-position-embeddings", "16", "--tokenizer-type", "NullTokenizer",
                             "--vocab-size", "99", "--mock-data", "--micro-batch-size", "1", "--train-iters", "3",
                             "--lr", "1e-3", "--ckpt-format", "torch"});
  std::vector<char*> argv;
  for (std::string& f : flags) argv.push_back(f.data());
  return megatron_namespace(parse_train_args(static_cast<int>(argv.size()), argv.data(), nullptr, world_size), 24, 0);
}

TEST(MegatronNamespace, HasExactlyMegatronsAttributes) {
  const std::set<std::string> want = megatron_dests();
  ASSERT_GT(want.size(), 300u);
  const nlohmann::json ns = namespace_of({});
  std::set<std::string> got;
  for (const auto& [k, v] : ns.items()) got.insert(k);
  EXPECT_EQ(got, want);
}

TEST(MegatronNamespace, ValuesLoadersReadForAGptWithBiases) {
  const nlohmann::json ns = namespace_of({"--tensor-model-parallel-size", "2"}, 2);
  EXPECT_EQ(ns["add_bias_linear"], true);
  EXPECT_EQ(ns["add_qkv_bias"], true);
  EXPECT_EQ(ns["swiglu"], false);
  EXPECT_EQ(ns["normalization"], "LayerNorm");
  EXPECT_EQ(ns["position_embedding_type"], "learned_absolute");
  EXPECT_EQ(ns["params_dtype"], (nlohmann::json{{"$global", "torch.float32"}}));
  EXPECT_EQ(ns["padded_vocab_size"], 256);  // 100 tokens padded to 128 x TP 2
  EXPECT_EQ(ns["num_query_groups"], 4);
  EXPECT_EQ(ns["group_query_attention"], false);
  EXPECT_EQ(ns["rotary_base"], 10000);
  EXPECT_EQ(ns["untie_embeddings_and_output_weights"], false);
  EXPECT_EQ(ns["use_legacy_models"], false);
  EXPECT_EQ(ns["ckpt_format"], "torch");
  EXPECT_EQ(ns["use_dist_ckpt"], false);
  EXPECT_EQ(ns["tensor_model_parallel_size"], 2);
  EXPECT_EQ(ns["pipeline_model_parallel_size"], 1);
  EXPECT_EQ(ns["data_parallel_size"], 1);
  EXPECT_EQ(ns["world_size"], 2);
  EXPECT_EQ(ns["consumed_train_samples"], 24);
  EXPECT_EQ(ns["use_rope_scaling"], false);
}

TEST(MegatronNamespace, ValuesLoadersReadForALlamaWithoutBiases) {
  const nlohmann::json ns = namespace_of({"--group-query-attention", "--num-query-groups", "2", "--swiglu",
                                          "--normalization", "RMSNorm", "--position-embedding-type", "rope",
                                          "--rotary-base", "500000", "--disable-bias-linear",
                                          "--untie-embeddings-and-output-weights", "--bf16",
                                          "--pipeline-model-parallel-size", "2"},
                                         4);
  EXPECT_EQ(ns["add_bias_linear"], false);
  EXPECT_EQ(ns["add_qkv_bias"], false);
  EXPECT_EQ(ns["bias_gelu_fusion"], false);
  EXPECT_EQ(ns["swiglu"], true);
  EXPECT_EQ(ns["normalization"], "RMSNorm");
  EXPECT_EQ(ns["position_embedding_type"], "rope");
  EXPECT_EQ(ns["params_dtype"], (nlohmann::json{{"$global", "torch.bfloat16"}}));
  EXPECT_EQ(ns["num_query_groups"], 2);
  EXPECT_EQ(ns["group_query_attention"], true);
  EXPECT_EQ(ns["rotary_base"], 500000);
  EXPECT_EQ(ns["untie_embeddings_and_output_weights"], true);
  EXPECT_EQ(ns["pipeline_model_parallel_size"], 2);
  EXPECT_EQ(ns["transformer_pipeline_model_parallel_size"], 2);
  EXPECT_EQ(ns["data_parallel_size"], 2);
  EXPECT_EQ(ns["accumulate_allreduce_grads_in_fp32"], true);
}

}  // namespace
}  // namespace tessera
