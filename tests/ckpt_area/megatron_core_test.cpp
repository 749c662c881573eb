// Megatron-LM's checkpoints against the real tools (tests/reference/megatron_core_models.py,
// run in the tools venv: torch 2.6, megatron-core 0.10.0 on the CPU), both ways, for a tiny
// GPT with biases and a tiny Llama (RMSNorm, RoPE base 500000, SwiGLU, GQA, no biases, untied):
//   - megatron-core's GPTModel saved as Megatron's save_checkpoint writes it (its own
//     state_dict(): an OrderedDict with _metadata; torch's optimizer, megatron-core's scheduler
//     and rerun state, numpy's RNG state) loads into tessera, the model flags taken from the
//     file's Namespace, and tessera's logits equal megatron-core's within 1e-5;
//   - tessera's `--ckpt-format torch` save loads into megatron-core's GPTModel built from the
//     saved Namespace as pretrain_gpt.py builds it (load_state_dict strict), the Namespace's
//     attributes are exactly Megatron's (megatron_namespace_dests.txt) with the values loaders
//     read, and megatron-core's logits equal tessera's within 1e-5;
//   - the same both ways for an MoE Llama ("moe": 4 SwiGLU experts, top-2, MoE every second layer,
//     shared experts; megatron-core's SequentialMLP names), and at expert parallelism 2
//     ("moe_ep2": the mp_rank_00_EEE folders of megatron-core's two EP ranks, each with its own
//     experts numbered from 0 and its ChainedOptimizer's dense and expert state, read into
//     tessera at EP=1 with every optimizer state tensor; tessera's save converted with
//     `ckpt convert --target-expert-parallel-size 2`, and its own training save at EP=2, load
//     into megatron-core's EP ranks);
//   - tessera's EP=2 training save's optimizer state, fp32 and bf16, is what megatron-core's
//     get_megatron_optimizer builds for each EP rank (a ChainedOptimizer of the dense and the
//     expert optimizer: groups, indices), loads with its load_state_dict, and holds tessera's
//     own save's state of the same run bit for bit; with --use-distributed-optimizer its groups
//     are the distributed optimizer's state_dict of each;
//   - --moe-grouped-gemm (tests/reference/megatron_grouped_experts.py): megatron-core's GroupedMLP
//     and TEGroupedMLP files read as SequentialMLP's, tessera's grouped save loads strictly into
//     GroupedMLP, and torch_dist's grouped keys are SequentialMLP's (in the tdist venv).
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <regex>

#include "tessera/ckpt/checkpoint.h"
#include "tessera/ckpt/megatron_checkpoint.h"
#include "tessera/ckpt/pickle.h"
#include "tessera/ckpt/safetensors.h"
#include "tessera/ckpt/torch_file.h"
#include "tessera/comm/in_process/in_process_communicator.h"
#include "tessera/core/error.h"
#include "tessera/device/device.h"
#include "tessera/model/gpt.h"
#include "tessera/train/arguments.h"
#include "tessera/train/megatron_args.h"

namespace fs = std::filesystem;

namespace tessera {
namespace {

const std::string kScript = std::string(TESSERA_SOURCE_DIR) + "/tests/reference/megatron_core_models.py";

fs::path scratch(const std::string& name) {
  const fs::path d = fs::path(TESSERA_BINARY_DIR) / "Testing" / "tmp" / (name + "_" + std::to_string(getpid()));
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

// Runs a command line; its output goes to LOG, whose tail the failure shows.
testing::AssertionResult run(const std::string& cmd, const fs::path& log) {
  const int s = std::system(("timeout 200 " + cmd + " > " + log.string() + " 2>&1").c_str());
  if (WIFEXITED(s) && WEXITSTATUS(s) == 0) return testing::AssertionSuccess();
  std::ifstream in(log);
  const std::string out((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  return testing::AssertionFailure() << cmd << "\n" << out.substr(out.size() > 4000 ? out.size() - 4000 : 0);
}

const std::vector<std::string> kGpt = {"--num-layers", "2", "--hidden-size", "32", "--num-attention-heads", "4",
                                       "--seq-length", "16", "--max-position-embeddings", "16", "--tokenizer-type",
                                       "NullTokenizer", "--vocab-size", "99", "--make-vocab-size-divisible-by", "64",
                                       "--hidden-dropout", "0", "--attention-dropout", "0"};
const std::vector<std::string> kLlama = {"--group-query-attention", "--num-query-groups", "2", "--kv-channels", "8",
                                         "--ffn-hidden-size", "64", "--swiglu", "--normalization", "RMSNorm",
                                         "--norm-epsilon", "1e-5", "--position-embedding-type", "rope",
                                         "--rotary-base", "500000", "--disable-bias-linear",
                                         "--untie-embeddings-and-output-weights"};
const std::vector<std::string> kMoE = {"--num-experts", "4", "--moe-router-topk", "2", "--moe-layer-freq", "2",
                                       "--moe-shared-expert-intermediate-size", "32", "--moe-aux-loss-coeff", "0.01"};

// The model a checkpoint's Namespace describes, as `tessera ckpt` derives it.
GPTConfig config_of(const CheckpointState& s) {
  std::vector<std::string> flags = train_flags_from_megatron_args(s.args);
  flags.insert(flags.end(), {"--mock-data", "--micro-batch-size", "1", "--train-iters", "1", "--lr", "1e-4"});
  std::vector<char*> argv;
  for (std::string& f : flags) argv.push_back(f.data());
  GPTConfig c = parse_train_args(static_cast<int>(argv.size()), argv.data()).model;
  c.padded_vocab_size = static_cast<int>(s.layout.padded_vocab_size);
  return c;
}

// tessera's logits [B*T, V] for `tokens` of the latest checkpoint in `dir` (one process).
std::vector<float> tessera_logits(const fs::path& dir, const std::vector<int32_t>& tokens, int B) {
  const int64_t iteration = *latest_checkpoint_iteration(dir.string());
  const CheckpointState meta = read_checkpoint_metadata(dir.string(), iteration);
  EXPECT_TRUE(meta.megatron_format);
  const GPTConfig c = config_of(meta);
  const int T = c.seq_length;
  std::vector<float> out;
  run_in_process_ranks(1, [&](Communicator& comm) {
    GPTModel model(c, cpu_device(), B, ModelPartition::whole(c), {1}, {1}, &comm);
    std::vector<ShardedTensor> targets;
    for (size_t i = 0; i < model.shards().size(); ++i) {
      const ParamShard& s = model.shards()[i];
      targets.push_back({s.spec.name, model.params()[i], s.spec.shape, s.split_dim, s.offset});
    }
    load_checkpoint(dir.string(), iteration, targets, {}, false, 0, 1);
    std::vector<int32_t> tok = tokens, pos, labels(tokens.size(), 0);
    for (int i = 0; i < B * T; ++i) pos.push_back(i % T);
    std::vector<float> mask(static_cast<size_t>(B * T), 1.0f);
    Device* d = &cpu_device();
    const MicroBatch mb{Tensor(tok.data(), DType::I32, {B, T}, d), Tensor(pos.data(), DType::I32, {B, T}, d),
                        Tensor(labels.data(), DType::I32, {B, T}, d), Tensor(mask.data(), DType::F32, {B, T}, d)};
    model.forward(mb, StepContext{0, 0, false});
    const Tensor logits = model.logits();
    out.assign(logits.f32(), logits.f32() + logits.numel());
  });
  return out;
}

// tessera's reading of the optimizer state of the latest checkpoint in `dir` (one process, EP=1):
// "exp_avg.NAME" and "exp_avg_sq.NAME" of every parameter.
std::map<std::string, std::vector<float>> tessera_optimizer_state(const fs::path& dir) {
  const int64_t iteration = *latest_checkpoint_iteration(dir.string());
  const GPTConfig c = config_of(read_checkpoint_metadata(dir.string(), iteration));
  std::map<std::string, std::vector<float>> out;
  run_in_process_ranks(1, [&](Communicator& comm) {
    GPTModel model(c, cpu_device(), 1, ModelPartition::whole(c), {1}, {1}, &comm);
    std::vector<ShardedTensor> params, state;
    for (size_t i = 0; i < model.shards().size(); ++i) {
      const ParamShard& s = model.shards()[i];
      params.push_back({s.spec.name, model.params()[i], s.spec.shape, s.split_dim, s.offset});
      for (const std::string kind : {"exp_avg.", "exp_avg_sq."}) {
        std::vector<float>& v = out[kind + s.spec.name];
        v.resize(static_cast<size_t>(s.numel()));
        state.push_back({kind + s.spec.name, Tensor(v.data(), DType::F32, s.shape, &cpu_device()), s.spec.shape,
                         s.split_dim, s.offset});
      }
    }
    load_checkpoint(dir.string(), iteration, params, state, true, 0, 1);
  });
  return out;
}

class MegatronCore : public testing::TestWithParam<std::string> {
 protected:
  bool llama() const { return GetParam() != "gpt"; }
  bool moe() const { return GetParam().starts_with("moe"); }
  int ep() const { return GetParam() == "moe_ep2" ? 2 : 1; }
  // The reference's --model and --ep.
  std::string model_flags() const {
    return " --model " + (moe() ? std::string("moe") : GetParam()) + " --ep " + std::to_string(ep());
  }
};

TEST_P(MegatronCore, ItsCheckpointLoadsIntoTesseraWithItsLogits) {
  const fs::path dir = scratch("megatron_core_" + GetParam());
  ASSERT_TRUE(run(std::string(TESSERA_TOOLS_PYTHON) + " " + kScript + " save " + (dir / "ckpt").string() +
                      model_flags(),
                  dir / "save.log"));
  const safetensors::Reader expected = safetensors::Reader::open((dir / "ckpt" / "expected.safetensors").string());
  const std::vector<int64_t> tokens64 = expected.read_i64("tokens");
  const std::vector<float> want = expected.read_f32("logits");
  const std::vector<float> got = tessera_logits(dir / "ckpt", {tokens64.begin(), tokens64.end()}, 2);
  ASSERT_EQ(got.size(), want.size());
  double diff = 0, scale = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    diff = std::max(diff, std::fabs(static_cast<double>(got[i]) - want[i]));
    scale = std::max(scale, std::fabs(static_cast<double>(want[i])));
  }
  EXPECT_GT(scale, 0.1);
  EXPECT_LE(diff, 1e-5 * scale) << "max |logit| " << scale;
  // The Namespace's fields tessera takes: the Llama's RoPE base, GQA and no biases.
  std::string flags;
  for (const std::string& f : train_flags_from_megatron_args(read_checkpoint_metadata((dir / "ckpt").string(), 7).args))
    flags += f + " ";
  if (GetParam() == "moe") {
    // Its run continues in tessera with its args and its optimizer state (torch's AdamW under
    // Megatron's parameter groups, the experts' state among them: the group sizes are checked).
    ASSERT_TRUE(run(std::string("env OMP_NUM_THREADS=1 ") + TESSERA_EXE + " train --load " + (dir / "ckpt").string() +
                        " --use-checkpoint-args --use-checkpoint-opt_param-scheduler --mock-data --micro-batch-size 1"
                        " --global-batch-size 8 --train-iters 8 --lr 1e-3 --eval-iters 0 --log-interval 1",
                    dir / "resume.log"));
    std::ifstream in(dir / "resume.log");
    const std::string resumed((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    EXPECT_NE(resumed.find("iteration        8/       8"), std::string::npos) << resumed;
    EXPECT_NE(resumed.find("load_balancing_loss"), std::string::npos) << resumed;
    // An experts' entry that none of megatron-core's expert modules saves is refused by name,
    // not read as an unknown parameter.
    const fs::path file = dir / "ckpt" / "iter_0000007" / "mp_rank_00" / kMegatronFile;
    std::ofstream(dir / "unknown.py") << "import sys, torch\n"
                                         "sd = torch.load(sys.argv[1], weights_only=False)\n"
                                         "sd['model']['decoder.layers.0.mlp.experts.weight3'] = torch.zeros(32, 512)\n"
                                         "torch.save(sd, sys.argv[1])\n";
    ASSERT_TRUE(run(std::string(TESSERA_TOOLS_PYTHON) + " " + (dir / "unknown.py").string() + " " + file.string(),
                    dir / "unknown.log"));
    try {
      load_checkpoint((dir / "ckpt").string(), 7, {}, {}, false, 0, 1);
      ADD_FAILURE() << "an unknown experts' entry loaded";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("mlp.experts.weight3 is no expert weight"), std::string::npos) << e.what();
    }
  }
  if (ep() > 1) {
    // Its ChainedOptimizer's state, read by EP=1 names: every tensor the reference recorded.
    const std::map<std::string, std::vector<float>> state = tessera_optimizer_state(dir / "ckpt");
    size_t compared = 0;
    for (const safetensors::TensorInfo& t : expected.tensors()) {
      const std::string& name = t.name;
      if (!name.starts_with("exp_avg")) continue;
      ASSERT_TRUE(state.count(name)) << name;
      EXPECT_EQ(state.at(name), expected.read_f32(name)) << name;
      ++compared;
    }
    EXPECT_EQ(compared, state.size());
    // Bad files are errors naming the file: damaged distrib_optim.pt files beside the EP ranks'
    // files, and an EP rank's optimizer saved as one dict where its experts need the chain.
    const fs::path it_dir = dir / "ckpt" / "iter_0000007";
    auto load_error = [&] {
      try {
        tessera_optimizer_state(dir / "ckpt");
      } catch (const Error& e) {
        return std::string(e.what()) + "\n" + e.hint();
      }
      return std::string("no error");
    };
    for (const char* folder : {"mp_rank_00_000", "mp_rank_00_001"}) std::ofstream(it_dir / folder / "distrib_optim.pt");
    std::string error = load_error();
    EXPECT_NE(error.find((it_dir / "mp_rank_00_000" / "distrib_optim.pt").string() + " is not a valid zip archive"),
              std::string::npos)
        << error;
    for (const char* folder : {"mp_rank_00_000", "mp_rank_00_001"}) fs::remove(it_dir / folder / "distrib_optim.pt");
    const fs::path file = it_dir / "mp_rank_00_001" / kMegatronFile;
    std::ofstream(dir / "unchain.py") << "import sys, torch\n"
                                         "sd = torch.load(sys.argv[1], weights_only=False)\n"
                                         "sd['optimizer'] = sd['optimizer'][0]\n"
                                         "torch.save(sd, sys.argv[1])\n";
    ASSERT_TRUE(run(std::string(TESSERA_TOOLS_PYTHON) + " " + (dir / "unchain.py").string() + " " + file.string(),
                    dir / "unchain.log"));
    error = load_error();
    EXPECT_NE(error.find(file.string() + ": the optimizer's parameter groups do not match the model's (1 optimizer "
                         "saved; its local experts need a dense and an expert optimizer, chained)"),
              std::string::npos)
        << error;
    EXPECT_NE(error.find("--no-load-optim"), std::string::npos) << error;
  }
  if (moe()) {
    EXPECT_NE(flags.find("--num-experts 4 "), std::string::npos) << flags;
    EXPECT_NE(flags.find("--moe-layer-freq 2 "), std::string::npos) << flags;
    EXPECT_NE(flags.find("--moe-shared-expert-intermediate-size 32 "), std::string::npos) << flags;
  }
  if (llama()) {
    EXPECT_NE(flags.find("--rotary-base 500000 "), std::string::npos) << flags;
    EXPECT_NE(flags.find("--disable-bias-linear "), std::string::npos) << flags;
    EXPECT_NE(flags.find("--num-query-groups 2 "), std::string::npos) << flags;
  }
  fs::remove_all(dir);
}

TEST_P(MegatronCore, ReadsTesseraTorchFormatSaveStrictlyWithTheSameLogits) {
  const fs::path dir = scratch("tessera_torch_save_" + GetParam());
  std::vector<std::string> flags = kGpt;
  if (llama()) flags.insert(flags.end(), kLlama.begin(), kLlama.end());
  if (moe()) flags.insert(flags.end(), kMoE.begin(), kMoE.end());
  // Initial weights of std 0.2, so that the GELU's tanh approximation differs from erf by more
  // than the bound.
  flags.insert(flags.end(), {"--mock-data", "--micro-batch-size", "1", "--global-batch-size", "2", "--train-iters",
                             "2", "--lr", "1e-2", "--min-lr", "1e-4", "--eval-iters", "0", "--init-method-std", "0.2",
                             "--save", (dir / "ckpt").string(), "--save-interval", "2", "--ckpt-format", "torch"});
  std::string cmd = std::string("env OMP_NUM_THREADS=1 ") + TESSERA_EXE + " train";
  for (const std::string& f : flags) cmd += " " + f;
  ASSERT_TRUE(run(cmd, dir / "train.log"));
  std::vector<fs::path> ckpts = {dir / "ckpt"};
  if (ep() > 1) {
    // tessera's EP=1 save converted to EP folders, and its own save at EP=2 (two processes,
    // each writing its mp_rank_00_EEE with its experts, the replicated parameters and its
    // optimizer state).
    ckpts = {dir / "ckpt_ep", dir / "ckpt_train_ep"};
    ASSERT_TRUE(run(std::string(TESSERA_EXE) + " ckpt convert " + (dir / "ckpt").string() + " " +
                        ckpts[0].string() + " --to torch --target-expert-parallel-size " + std::to_string(ep()),
                    dir / "convert.log"));
    std::string ep_cmd = std::string("env -u MASTER_ADDR -u MASTER_PORT -u RANK -u WORLD_SIZE OMP_NUM_THREADS=1 ") +
                         TESSERA_EXE + " launch --standalone --nproc_per_node 2 train";
    for (const std::string& f : flags) ep_cmd += " " + (f == (dir / "ckpt").string() ? ckpts[1].string() : f);
    ASSERT_TRUE(run(ep_cmd + " --expert-model-parallel-size 2", dir / "train_ep.log"));
    for (const fs::path& c : ckpts) EXPECT_TRUE(fs::exists(c / "iter_0000002" / "mp_rank_00_001" / kMegatronFile));
  }
  std::vector<int32_t> tokens;
  for (int i = 0; i < 2 * 16; ++i) tokens.push_back((i * 37 + 11) % 100);
  for (const fs::path& ckpt : ckpts) {
    // tessera reads its EP save back too: its logits are those of the files megatron-core reads.
    const std::vector<float> logits = tessera_logits(ckpt, tokens, 2);
    const int64_t V = static_cast<int64_t>(logits.size()) / 32;
    const fs::path mine = dir / (ckpt.filename().string() + ".safetensors");
    safetensors::write(mine.string(), {{"tokens", DType::I32, {2, 16}, tokens.data()},
                                       {"logits", DType::F32, {2, 16, V}, logits.data()}});
    EXPECT_TRUE(run(std::string(TESSERA_TOOLS_PYTHON) + " " + kScript + " check " + ckpt.string() + " " +
                        mine.string() + model_flags(),
                    dir / (ckpt.filename().string() + "_check.log")));
  }
  fs::remove_all(dir);
}

// tessera's EP=2 training save with its optimizer state (fp32, and bf16 with its fp32 main
// parameters) against the optimizer megatron-core builds for each EP rank, and against tessera's
// own save of the same run (--deterministic-mode: the two runs are the same bits).
TEST(MegatronCoreOptimizer, TesseraSaveAtEp2IsMegatronsChainedOptimizer) {
  const fs::path dir = scratch("megatron_core_ep2_optimizer");
  std::vector<std::string> flags = kGpt;
  flags.insert(flags.end(), kLlama.begin(), kLlama.end());
  flags.insert(flags.end(), kMoE.begin(), kMoE.end());
  flags.insert(flags.end(), {"--mock-data", "--micro-batch-size", "1", "--global-batch-size", "2", "--train-iters",
                             "2", "--lr", "1e-2", "--min-lr", "1e-4", "--eval-iters", "0", "--save-interval", "2",
                             "--expert-model-parallel-size", "2", "--deterministic-mode"});
  std::string cmd = std::string("env -u MASTER_ADDR -u MASTER_PORT -u RANK -u WORLD_SIZE OMP_NUM_THREADS=1 ") +
                    TESSERA_EXE + " launch --standalone --nproc_per_node 2 train";
  for (const std::string& f : flags) cmd += " " + f;
  for (const std::string precision : {"fp32", "bf16", "distributed"}) {
    const std::string run_cmd = cmd + (precision == "bf16"          ? " --bf16"
                                       : precision == "distributed" ? " --use-distributed-optimizer"
                                                                    : "");
    const fs::path torch_save = dir / (precision + "_torch"), tessera_save = dir / (precision + "_tessera");
    ASSERT_TRUE(run(run_cmd + " --ckpt-format torch --save " + torch_save.string(), dir / (precision + "_torch.log")));
    ASSERT_TRUE(run(run_cmd + " --ckpt-format tessera --save " + tessera_save.string(),
                    dir / (precision + "_tessera.log")));
    EXPECT_TRUE(run(std::string(TESSERA_TOOLS_PYTHON) + " " + kScript + " check-optimizer " + torch_save.string() +
                        " " + tessera_save.string() + " --model moe",
                    dir / (precision + "_check.log")));
  }
  fs::remove_all(dir);
}

// torch.save of what Megatron's checkpoints hold besides the model, read back as data.
TEST(TorchPickles, WhatTorchAndNumpyWriteReadsAsData) {
  const fs::path dir = scratch("torch_pickles");
  const std::string save_script = R"(
import pickle, sys, collections, numpy as np, torch
from megatron.core.tensor_parallel.layers import set_tensor_model_parallel_attributes
sd = torch.nn.Linear(2, 3).state_dict()
sd._other = 5
with_attrs = torch.nn.Parameter(torch.arange(4.0))
set_tensor_model_parallel_attributes(with_attrs, True, 0, 1)
np.random.seed(3)
torch.save({'state_dict': sd, 'parameter': torch.nn.Parameter(torch.zeros(3)), 'megatron_parameter': with_attrs,
            'size': torch.ones(2, 3).shape, 'np_rng_state': np.random.get_state()}, sys.argv[1])
)";
  const std::string numpy2_script = R"(
import pickle, sys, numpy as np
np.random.seed(3)
open(sys.argv[1], 'wb').write(pickle.dumps(np.random.get_state(), protocol=2))
)";
  std::ofstream(dir / "save.py") << save_script;
  std::ofstream(dir / "numpy2.py") << numpy2_script;
  ASSERT_TRUE(run(std::string(TESSERA_TOOLS_PYTHON) + " " + (dir / "save.py").string() + " " + (dir / "t.pt").string(),
                  dir / "save.log"));
  ASSERT_TRUE(run(std::string(TESSERA_TEST_PYTHON) + " " + (dir / "numpy2.py").string() + " " +
                      (dir / "numpy2.pkl").string(),
                  dir / "numpy2.log"));
  const TorchFile f = TorchFile::open((dir / "t.pt").string());
  const pickle::Value& root = f.root();
  const pickle::Value* sd = root.get("state_dict");
  ASSERT_TRUE(sd && sd->kind == pickle::Kind::Dict && sd->state);
  EXPECT_EQ(sd->text, "OrderedDict");
  EXPECT_EQ(sd->get("weight")->tensor.shape, (std::vector<int64_t>{3, 2}));
  ASSERT_TRUE(sd->state->get("_metadata"));
  EXPECT_EQ(sd->state->get("_metadata")->get("")->get("version")->integer, 1);
  EXPECT_EQ(sd->state->get("_other")->integer, 5);
  EXPECT_EQ(root.get("parameter")->tensor.shape, (std::vector<int64_t>{3}));
  EXPECT_EQ(f.f32(root.get("megatron_parameter")->tensor, "megatron_parameter"), (std::vector<float>{0, 1, 2, 3}));
  const pickle::Value* size = root.get("size");
  ASSERT_EQ(size->kind, pickle::Kind::Tuple);
  EXPECT_EQ(size->items.size(), 2u);
  EXPECT_EQ(size->items[1]->integer, 3);
  // numpy's MT19937 state: ('MT19937', uint32[624], pos, has_gauss, cached_gaussian), the
  // array as numpy's reconstruction record whose BUILD state ends with its raw bytes.
  std::ifstream in(dir / "numpy2.pkl", std::ios::binary);
  const std::vector<uint8_t> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const pickle::Document numpy2 = pickle::unpickle(bytes, "numpy2.pkl");
  for (const pickle::Value* state : {root.get("np_rng_state"), static_cast<const pickle::Value*>(numpy2.root)}) {
    ASSERT_EQ(state->kind, pickle::Kind::Tuple);
    ASSERT_EQ(state->items.size(), 5u);
    EXPECT_TRUE(state->items[0]->is_str("MT19937"));
    const pickle::Value* array = state->items[1];
    ASSERT_EQ(array->kind, pickle::Kind::Object);
    ASSERT_TRUE(array->state && array->state->kind == pickle::Kind::Tuple);
    EXPECT_EQ(array->state->items.back()->text.size(), 624u * 4);
    EXPECT_EQ(state->items[2]->integer, 624);
  }
  fs::remove_all(dir);
}

INSTANTIATE_TEST_SUITE_P(GptLlamaMoE, MegatronCore, testing::Values("gpt", "llama", "moe", "moe_ep2"));

// ---- Grouped-GEMM experts (--moe-grouped-gemm), tests/reference/megatron_grouped_experts.py ----

const std::string kGroupedScript = std::string(TESSERA_SOURCE_DIR) + "/tests/reference/megatron_grouped_experts.py";

std::string file_text(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return {(std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>()};
}

// The model and optimizer of the tessera-format save in dir (iteration `it`), byte for byte.
void expect_same_tessera_files(const fs::path& a, const fs::path& b, int it, bool optimizer) {
  char folder[32];
  std::snprintf(folder, sizeof folder, "iter_%07d/mp_rank_00", it);
  for (const char* name : {"model.safetensors", "optimizer.safetensors"}) {
    if (!optimizer && std::string(name) == "optimizer.safetensors") continue;
    const std::string x = file_text(a / folder / name), y = file_text(b / folder / name);
    EXPECT_FALSE(x.empty()) << a / folder / name;
    EXPECT_TRUE(x == y) << a / folder / name << " differs from " << b / folder / name;
  }
}

// The log's figures of its last iteration (lm loss, load_balancing_loss, loss scale, grad norm).
std::string last_iteration_figures(const fs::path& log) {
  const std::string text = file_text(log);
  static const std::regex figures(
      "lm loss: [^|]*\\| load_balancing_loss: [^|]*\\| loss scale: [^|]*\\| grad norm: [^|]*");
  std::string last;
  for (auto it = std::sregex_iterator(text.begin(), text.end(), figures); it != std::sregex_iterator(); ++it)
    last = it->str();
  return last;
}

// Resumes the Megatron checkpoint `ckpt` for one iteration (8 of 8 global batches of 8) and
// saves it in tessera's format at `out`.
testing::AssertionResult resume_one_iteration(const fs::path& ckpt, const fs::path& out, int iterations,
                                              const std::string& extra = "") {
  return run(std::string("env OMP_NUM_THREADS=1 ") + TESSERA_EXE + " train --load " + ckpt.string() +
                 " --use-checkpoint-args --use-checkpoint-opt_param-scheduler --mock-data --micro-batch-size 1"
                 " --global-batch-size 8 --train-iters " + std::to_string(iterations) +
                 " --lr 1e-3 --eval-iters 0 --log-interval 1 --ckpt-format tessera --save " + out.string() +
                 " --save-interval " + std::to_string(iterations) + extra,
             out.string() + ".log");
}

// megatron-core's MoE Llama saved with --moe-grouped-gemm reads into tessera as the SequentialMLP
// checkpoint of the same weights: its GroupedMLP file at TP=1 EP=1 ("tp1"), with AdamW's state
// mapped as its weights, resumes for an iteration to the same figures and the same model and
// optimizer bytes; the four files of TP=2 x EP=2 ("tp2_ep2") of GroupedMLP and of TEGroupedMLP's
// names convert to the same tessera model bytes, and so does tessera's TEGroupedMLP save of them.
class MegatronGrouped : public testing::TestWithParam<std::string> {};

TEST_P(MegatronGrouped, ItsGroupedFilesReadAsItsSequentialOne) {
  const bool sharded = GetParam() == "tp2_ep2";
  const fs::path dir = scratch("megatron_grouped_" + GetParam());
  ASSERT_TRUE(run(std::string(TESSERA_TOOLS_PYTHON) + " " + kGroupedScript + " save " + dir.string() +
                      (sharded ? " --layouts local te --tp 2 --ep 2" : " --layouts local"),
                  dir / "save.log"));
  // --use-checkpoint-args takes --moe-grouped-gemm (as Megatron's load_args_from_checkpoint), and
  // the sequence parallelism MoE needs at TP > 1.
  std::string flags;
  const CheckpointState grouped = read_checkpoint_metadata((dir / "grouped_local").string(), 7);
  for (const std::string& f : train_flags_from_megatron_args(grouped.args)) flags += f + " ";
  EXPECT_NE(flags.find("--moe-grouped-gemm "), std::string::npos) << flags;
  EXPECT_EQ(flags.find("--sequence-parallel ") != std::string::npos, sharded) << flags;
  if (!sharded) {
    ASSERT_TRUE(resume_one_iteration(dir / "sequential", dir / "resumed_sequential", 8));
    ASSERT_TRUE(resume_one_iteration(dir / "grouped_local", dir / "resumed_grouped", 8));
    const std::string figures = last_iteration_figures(dir / "resumed_sequential.log");
    EXPECT_NE(figures, "");
    EXPECT_EQ(figures, last_iteration_figures(dir / "resumed_grouped.log"));
    expect_same_tessera_files(dir / "resumed_sequential", dir / "resumed_grouped", 8, true);
    // Beside a distrib_optim.pt, the grouped tensors' distributed-optimizer state is refused.
    std::ofstream(dir / "grouped_local" / "iter_0000007" / "mp_rank_00" / "distrib_optim.pt") << "";
    try {
      load_checkpoint((dir / "grouped_local").string(), 7, {}, {}, true, 0, 1);
      ADD_FAILURE() << "a GroupedMLP checkpoint's distrib_optim.pt was read";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("holds GroupedMLP experts"), std::string::npos) << e.what();
    }
    // A weight1 whose columns do not split over the local experts is an error naming it.
    const fs::path file = dir / "grouped_local" / "iter_0000007" / "mp_rank_00" / kMegatronFile;
    std::ofstream(dir / "narrow.py") << "import sys, torch\n"
                                        "sd = torch.load(sys.argv[1], weights_only=False)\n"
                                        "sd['model']['decoder.layers.0.mlp.experts.weight1'] = torch.zeros(32, 510)\n"
                                        "torch.save(sd, sys.argv[1])\n";
    ASSERT_TRUE(run(std::string(TESSERA_TOOLS_PYTHON) + " " + (dir / "narrow.py").string() + " " + file.string(),
                    dir / "narrow.log"));
    try {
      load_checkpoint((dir / "grouped_local").string(), 7, {}, {}, false, 0, 1);
      ADD_FAILURE() << "a weight1 of 510 columns over 4 experts loaded";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("decoder.layers.0.mlp.experts.weight1 [32, 510] is not GroupedMLP's"),
                std::string::npos)
          << e.what();
    }
  } else {
    for (const char* c : {"sequential", "grouped_local", "grouped_te"})
      ASSERT_TRUE(run(std::string(TESSERA_EXE) + " ckpt convert " + (dir / c).string() + " " +
                          (dir / (std::string("tessera_") + c)).string() +
                          " --to tessera --target-tensor-parallel-size 1 --target-expert-parallel-size 1",
                      dir / (std::string(c) + "_convert.log")));
    // tessera writes TEGroupedMLP's names for a Namespace of transformer_impl transformer_engine
    // (ckpt convert keeps the source's), and reads them back as the same model.
    ASSERT_TRUE(run(std::string(TESSERA_EXE) + " ckpt convert " + (dir / "grouped_te").string() + " " +
                        (dir / "te_written").string() + " --to torch",
                    dir / "te_written.log"));
    std::vector<std::string> keys;
    for (const MegatronFileSummary& f : summarize_megatron_checkpoint((dir / "te_written").string(), 7))
      if (f.rel == "mp_rank_01_001/model_optim_rng.pt")
        for (const MegatronFileSummary::Entry& e : f.model) keys.push_back(e.key + " " + shape_str(e.shape));
    for (const char* key : {"decoder.layers.0.mlp.experts.linear_fc1.weight1 [64, 32]",
                            "decoder.layers.0.mlp.experts.linear_fc2.weight1 [32, 32]"})
      EXPECT_NE(std::find(keys.begin(), keys.end(), key), keys.end()) << key;
    ASSERT_TRUE(run(std::string(TESSERA_EXE) + " ckpt convert " + (dir / "te_written").string() + " " +
                        (dir / "tessera_te_written").string() +
                        " --to tessera --target-tensor-parallel-size 1 --target-expert-parallel-size 1",
                    dir / "te_written_convert.log"));
    for (const char* c : {"tessera_grouped_local", "tessera_grouped_te", "tessera_te_written"})
      expect_same_tessera_files(dir / "tessera_sequential", dir / c, 7, false);
  }
  fs::remove_all(dir);
}

INSTANTIATE_TEST_SUITE_P(Layouts, MegatronGrouped, testing::Values("tp1", "tp2_ep2"));

// tessera's --moe-grouped-gemm save (--ckpt-format torch) holds GroupedMLP's weight1/weight2: it
// loads strictly into megatron-core's GroupedMLP model built from its Namespace, whose forward
// gives tessera's logits; converted to EP=2, and saved by a training run at EP=2, each rank's
// file loads strictly into its rank's model and holds its share of the experts; and tessera reads
// it back as the save of the same run without the flag: one more iteration from either logs the
// same figures and saves the same model and optimizer bytes, in fp32 and bf16
// (fp32_from_fp16_params grouped like the weights).
TEST(MegatronGroupedSave, LoadsStrictlyIntoGroupedMLPAndBackIntoTessera) {
  const fs::path dir = scratch("tessera_grouped_save");
  std::vector<std::string> flags = kGpt;
  flags.insert(flags.end(), kLlama.begin(), kLlama.end());
  flags.insert(flags.end(), kMoE.begin(), kMoE.end());
  flags.insert(flags.end(), {"--mock-data", "--micro-batch-size", "1", "--global-batch-size", "8", "--train-iters",
                             "2", "--lr", "1e-2", "--min-lr", "1e-4", "--eval-iters", "0", "--init-method-std", "0.2",
                             "--save-interval", "2", "--ckpt-format", "torch"});
  std::string cmd = std::string("env OMP_NUM_THREADS=1 ") + TESSERA_EXE + " train";
  for (const std::string& f : flags) cmd += " " + f;
  ASSERT_TRUE(run(cmd + " --save " + (dir / "sequential").string(), dir / "sequential.log"));
  ASSERT_TRUE(run(cmd + " --moe-grouped-gemm --save " + (dir / "grouped").string(), dir / "grouped.log"));

  std::vector<int32_t> tokens;
  for (int i = 0; i < 2 * 16; ++i) tokens.push_back((i * 37 + 11) % 100);
  const std::vector<float> logits = tessera_logits(dir / "grouped", tokens, 2);
  EXPECT_EQ(logits, tessera_logits(dir / "sequential", tokens, 2));
  const fs::path mine = dir / "logits.safetensors";
  safetensors::write(mine.string(), {{"tokens", DType::I32, {2, 16}, tokens.data()},
                                     {"logits", DType::F32, {2, 16, static_cast<int64_t>(logits.size()) / 32},
                                      logits.data()}});
  EXPECT_TRUE(run(std::string(TESSERA_TOOLS_PYTHON) + " " + kGroupedScript + " check " + (dir / "grouped").string() +
                      " " + mine.string(),
                  dir / "check.log"));
  ASSERT_TRUE(run(std::string(TESSERA_EXE) + " ckpt convert " + (dir / "grouped").string() + " " +
                      (dir / "grouped_ep2").string() + " --to torch --target-expert-parallel-size 2",
                  dir / "convert.log"));
  EXPECT_TRUE(run(std::string(TESSERA_TOOLS_PYTHON) + " " + kGroupedScript + " check-ep " +
                      (dir / "grouped_ep2").string() + " " + (dir / "grouped").string(),
                  dir / "check_ep.log"));
  // tessera's own training save at EP=2 (two processes, each its mp_rank_00_EEE): the same, against
  // tessera's reading of it written back at EP=1.
  const std::string launch = std::string("env -u MASTER_ADDR -u MASTER_PORT -u RANK -u WORLD_SIZE OMP_NUM_THREADS=1 ") +
                             TESSERA_EXE + " launch --standalone --nproc_per_node 2 train";
  std::string ep_flags;
  for (const std::string& f : flags) ep_flags += " " + f;
  ASSERT_TRUE(run(launch + ep_flags + " --moe-grouped-gemm --expert-model-parallel-size 2 --save " +
                      (dir / "trained_ep2").string(),
                  dir / "trained_ep2.log"));
  ASSERT_TRUE(run(std::string(TESSERA_EXE) + " ckpt convert " + (dir / "trained_ep2").string() + " " +
                      (dir / "trained_ep1").string() + " --to torch --target-expert-parallel-size 1",
                  dir / "trained_convert.log"));
  EXPECT_TRUE(run(std::string(TESSERA_TOOLS_PYTHON) + " " + kGroupedScript + " check-ep " +
                      (dir / "trained_ep2").string() + " " + (dir / "trained_ep1").string(),
                  dir / "trained_check_ep.log"));
  // Its optimizer state is Megatron's chain at EP=2 ([dense, expert], GroupedMLP's weights in the
  // expert optimizer): it resumes as the same run saved without the flag.
  ASSERT_TRUE(run(launch + ep_flags + " --expert-model-parallel-size 2 --save " +
                      (dir / "trained_ep2_sequential").string(),
                  dir / "trained_ep2_sequential.log"));
  for (const char* c : {"trained_ep2", "trained_ep2_sequential"})
    ASSERT_TRUE(resume_one_iteration(dir / c, dir / (std::string("resumed_") + c), 3));
  EXPECT_EQ(last_iteration_figures((dir / "resumed_trained_ep2.log").string()),
            last_iteration_figures((dir / "resumed_trained_ep2_sequential.log").string()));
  expect_same_tessera_files(dir / "resumed_trained_ep2_sequential", dir / "resumed_trained_ep2", 3, true);

  // In bf16 too, whose optimizer keeps the fp32 main parameters as fp32_from_fp16_params.
  ASSERT_TRUE(run(cmd + " --bf16 --save " + (dir / "bf16_sequential").string(), dir / "bf16_sequential.log"));
  ASSERT_TRUE(run(cmd + " --bf16 --moe-grouped-gemm --save " + (dir / "bf16_grouped").string(),
                  dir / "bf16_grouped.log"));
  for (const char* c : {"sequential", "grouped", "bf16_sequential", "bf16_grouped"})
    ASSERT_TRUE(resume_one_iteration(dir / c, dir / (std::string("resumed_") + c), 3));
  for (const std::string precision : {"", "bf16_"}) {
    const fs::path sequential = dir / ("resumed_" + precision + "sequential"),
                   grouped = dir / ("resumed_" + precision + "grouped");
    const std::string figures = last_iteration_figures(sequential.string() + ".log");
    EXPECT_NE(figures, "");
    EXPECT_EQ(figures, last_iteration_figures(grouped.string() + ".log"));
    expect_same_tessera_files(sequential, grouped, 3, true);
  }
  fs::remove_all(dir);
}

// megatron-core keys GroupedMLP's torch_dist tensors (weights and optimizer state) as SequentialMLP's
// (the reference exits 1 otherwise): its torch_dist save of the MoE Llama with SequentialMLP and
// the same model loaded into GroupedMLP and saved again resume in tessera to the same figures and
// the same model and optimizer bytes; tessera's --moe-grouped-gemm torch_dist save loads with
// dist_checkpointing into megatron-core's GroupedMLP model (strict) with tessera's logits.
// Skipped without the tdist venv (torch 2.5.1: megatron-core 0.10.0's torch_dist needs it).
TEST(MegatronGroupedTorchDist, KeysAsSequentialMLPBothWays) {
  if (!fs::exists(TESSERA_TDIST_PYTHON)) GTEST_SKIP() << "no tdist venv at " << TESSERA_TDIST_PYTHON;
  const fs::path dir = scratch("grouped_torch_dist");
  ASSERT_TRUE(run(std::string(TESSERA_TDIST_PYTHON) + " " + kGroupedScript + " dist-save " + dir.string(),
                  dir / "dist_save.log"));
  for (const char* c : {"sequential", "grouped"})
    ASSERT_TRUE(resume_one_iteration(dir / c, dir / (std::string("resumed_") + c), 8));
  const std::string figures = last_iteration_figures(dir / "resumed_sequential.log");
  EXPECT_NE(figures, "");
  EXPECT_EQ(figures, last_iteration_figures(dir / "resumed_grouped.log"));
  expect_same_tessera_files(dir / "resumed_sequential", dir / "resumed_grouped", 8, true);

  std::vector<std::string> flags = kGpt;
  flags.insert(flags.end(), kLlama.begin(), kLlama.end());
  flags.insert(flags.end(), kMoE.begin(), kMoE.end());
  flags.insert(flags.end(), {"--mock-data", "--micro-batch-size", "1", "--global-batch-size", "2", "--train-iters",
                             "2", "--lr", "1e-2", "--eval-iters", "0", "--init-method-std", "0.2", "--save-interval",
                             "2", "--moe-grouped-gemm", "--ckpt-format", "torch_dist", "--save",
                             (dir / "tessera").string()});
  std::string cmd = std::string("env OMP_NUM_THREADS=1 ") + TESSERA_EXE + " train";
  for (const std::string& f : flags) cmd += " " + f;
  ASSERT_TRUE(run(cmd, dir / "tessera.log"));
  std::vector<int32_t> tokens;
  for (int i = 0; i < 2 * 16; ++i) tokens.push_back((i * 37 + 11) % 100);
  const std::vector<float> logits = tessera_logits(dir / "tessera", tokens, 2);
  const fs::path mine = dir / "logits.safetensors";
  safetensors::write(mine.string(), {{"tokens", DType::I32, {2, 16}, tokens.data()},
                                     {"logits", DType::F32, {2, 16, static_cast<int64_t>(logits.size()) / 32},
                                      logits.data()}});
  EXPECT_TRUE(run(std::string(TESSERA_TDIST_PYTHON) + " " + kGroupedScript + " dist-check " +
                      (dir / "tessera").string() + " " + mine.string(),
                  dir / "dist_check.log"));
  fs::remove_all(dir);
}

}  // namespace
}  // namespace tessera
