// Megatron-LM's own checkpoints into tessera's model: tests/reference/megatron_checkpoints.py
// builds TP=2 x PP=2 `--ckpt-format torch` checkpoints with PyTorch of a tiny GPT-2 (mcore
// names, Transformer Engine's fused-norm names, the legacy model's nested names) and of a tiny
// Llama (8 heads in 4 query groups, RMSNorm, RoPE, SwiGLU with each rank's [gate_r; up_r] fc1
// rows and query groups' QKV rows, untied; mcore
// and Transformer Engine names, and a converter-style release checkpoint), padded vocabulary
// rows copied from the last real row, and the float64 reference forward of the same weights.
// Each loads at TP=1 and TP=4 (ranks as threads), every stage's layers renumbered and every
// TP slice resharded, and the forward's logits and loss equal the reference's.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <mutex>

#include "tessera/ckpt/checkpoint.h"
#include "tessera/ckpt/megatron_checkpoint.h"
#include "tessera/ckpt/safetensors.h"
#include "tessera/comm/in_process/in_process_communicator.h"
#include "tessera/device/device.h"
#include "tessera/model/gpt.h"
#include "tessera/train/arguments.h"

namespace fs = std::filesystem;

namespace tessera {
namespace {

const fs::path& reference_dir() {
  static const fs::path dir = [] {
    fs::path d = fs::path(TESSERA_BINARY_DIR) / "Testing" / "tmp" / ("megatron_ckpt_test_" + std::to_string(getpid()));
    fs::remove_all(d);
    fs::create_directories(d);
    const std::string cmd = "timeout 120 /usr/bin/python3 " + std::string(TESSERA_SOURCE_DIR) +
                            "/tests/reference/megatron_checkpoints.py --out " + d.string() + " > " +
                            (d / "reference.log").string() + " 2>&1";
    const int s = std::system(cmd.c_str());
    EXPECT_TRUE(WIFEXITED(s) && WEXITSTATUS(s) == 0) << "megatron_checkpoints.py failed; see " << d / "reference.log";
    return d;
  }();
  return dir;
}

// The reference folders of the Llama checkpoints start with "llama".
bool is_llama(const std::string& folder) { return folder.rfind("llama", 0) == 0; }

GPTConfig reference_config(bool llama) {
  std::vector<std::string> flags = {"--num-layers", "2", "--hidden-size", "64", "--num-attention-heads",
                                    llama ? "8" : "4",
                                    "--seq-length", "16", "--max-position-embeddings", "16",
                                    "--make-vocab-size-divisible-by", "64", "--tokenizer-type", "NullTokenizer",
                                    "--vocab-size", "99", "--hidden-dropout", "0", "--attention-dropout", "0",
                                    "--mock-data", "--micro-batch-size", "2", "--train-iters", "1", "--lr", "1e-4"};
  if (llama)  // megatron_checkpoints.py's LLAMA
    flags.insert(flags.end(), {"--group-query-attention", "--num-query-groups", "4", "--kv-channels", "8",
                               "--ffn-hidden-size", "128", "--swiglu", "--normalization", "RMSNorm",
                               "--norm-epsilon", "1e-5", "--position-embedding-type", "rope", "--rotary-base",
                               "10000", "--disable-bias-linear", "--untie-embeddings-and-output-weights"});
  std::vector<char*> argv;
  for (std::string& f : flags) argv.push_back(f.data());
  GPTConfig c = parse_train_args(static_cast<int>(argv.size()), argv.data()).model;
  c.padded_vocab_size = 128;  // the checkpoint's (Megatron keeps it whatever TP loads it)
  return c;
}

// The reference folder is removed when every test of the program passed.
class RemoveReferenceOnSuccess : public testing::Environment {
 public:
  void TearDown() override {
    if (!testing::UnitTest::GetInstance()->Failed()) fs::remove_all(reference_dir());
  }
};
const auto* const kCleanup = testing::AddGlobalTestEnvironment(new RemoveReferenceOnSuccess);

class MegatronCheckpoint : public testing::TestWithParam<std::tuple<std::string, int>> {};

TEST_P(MegatronCheckpoint, LoadsAtAnyTensorParallelSizeWithTheReferenceLogits) {
  const auto [names, tp] = GetParam();
  const fs::path dir = reference_dir() / names;
  const bool release = names == "llama_release";
  const std::optional<int64_t> latest = latest_checkpoint_iteration(dir.string());
  ASSERT_EQ(latest, release ? kReleaseIteration : 7);
  ASSERT_TRUE(is_megatron_checkpoint(dir.string(), *latest));
  const safetensors::Reader expected = safetensors::Reader::open(
      (reference_dir() / (is_llama(names) ? "expected_llama.safetensors" : "expected.safetensors")).string());
  const std::vector<int64_t> tokens = expected.read_i64("tokens"), labels = expected.read_i64("labels");
  const std::vector<float> want_logits = expected.read_f32("logits");
  const double want_loss = expected.read_f32("loss")[0];
  const GPTConfig c = reference_config(is_llama(names));
  const int B = 2, T = c.seq_length;
  const int64_t Vp = c.padded_vocab_size;
  double max_logit = 0;
  for (float x : want_logits) max_logit = std::max(max_logit, std::fabs(static_cast<double>(x)));

  std::mutex mu;
  run_in_process_ranks(tp, [&](Communicator& comm) {
    ModelPartition part = ModelPartition::whole(c);
    part.tp_size = tp;
    part.tp_rank = comm.rank();
    GPTModel model(c, cpu_device(), B, part, {1}, {1}, &comm);
    std::vector<ShardedTensor> targets;
    for (size_t i = 0; i < model.shards().size(); ++i) {
      const ParamShard& s = model.shards()[i];
      targets.push_back({s.spec.name, model.params()[i], s.spec.shape, s.split_dim, s.offset});
    }
    const CheckpointState state = load_checkpoint(dir.string(), *latest, targets, {}, false, comm.rank(), tp);

    std::vector<int32_t> tok(tokens.begin(), tokens.end()), lab(labels.begin(), labels.end()), pos;
    for (int i = 0; i < B * T; ++i) pos.push_back(i % T);
    std::vector<float> mask(B * T, 1.0f);
    Device* d = &cpu_device();
    const MicroBatch mb{Tensor(tok.data(), DType::I32, {B, T}, d), Tensor(pos.data(), DType::I32, {B, T}, d),
                        Tensor(lab.data(), DType::I32, {B, T}, d), Tensor(mask.data(), DType::F32, {B, T}, d)};
    const double loss = model.forward(mb, StepContext{0, 0, false}) / (B * T);

    std::lock_guard<std::mutex> lock(mu);
    SCOPED_TRACE(std::string(names) + " tp " + std::to_string(tp) + " rank " + std::to_string(comm.rank()));
    EXPECT_TRUE(state.megatron_format);
    // A release checkpoint starts at iteration 0 (Megatron's converter records nothing consumed).
    EXPECT_EQ(state.release, release);
    EXPECT_EQ(state.iteration, release ? 0 : 7);
    EXPECT_EQ(state.consumed_train_samples, release ? 0 : 56);
    EXPECT_EQ(state.layout.tensor_parallel, 2);
    EXPECT_EQ(state.layout.pipeline_parallel, 2);
    EXPECT_EQ(state.layout.padded_vocab_size, 128);
    // float32 against the float64 reference: rounding of a 2-layer forward.
    EXPECT_NEAR(loss, want_loss, 1e-5 * want_loss);
    const Tensor logits = model.logits();
    const int64_t Vl = logits.dim(-1);
    ASSERT_EQ(Vl * tp, Vp);
    double max_diff = 0;
    for (int64_t r = 0; r < B * T; ++r)
      for (int64_t v = 0; v < Vl; ++v)
        max_diff = std::max(max_diff, std::fabs(static_cast<double>(logits.f32()[r * Vl + v]) -
                                                want_logits[r * Vp + comm.rank() * Vl + v]));
    EXPECT_LE(max_diff, 1e-5 * max_logit);
  });
}

INSTANTIATE_TEST_SUITE_P(NamesAndLayouts, MegatronCheckpoint,
                         testing::Combine(testing::Values("mcore", "te", "legacy", "llama_mcore", "llama_te",
                                                          "llama_release"),
                                          testing::Values(1, 4)),
                         [](const auto& info) {
                           return std::get<0>(info.param) + "_tp" + std::to_string(std::get<1>(info.param));
                         });

TEST(MegatronCheckpointState, SchedulerOptimizerAndArgsAsMegatronSavedThem) {
  const CheckpointState s = read_checkpoint_metadata((reference_dir() / "mcore").string(), 7);
  EXPECT_TRUE(s.megatron_format);
  EXPECT_EQ(s.scheduler_num_steps, 56);
  EXPECT_EQ(s.optimizer_steps, 7);
  EXPECT_EQ(s.scheduler.at("lr_decay_style"), "cosine");
  EXPECT_FALSE(s.scheduler.contains("num_steps"));
  EXPECT_EQ(s.args.at("params_dtype"), (nlohmann::json{{"$global", "torch.float32"}}));
  EXPECT_EQ(s.args.at("model_type").at("$enum"), "megatron.core.enums.ModelType");
  EXPECT_TRUE(s.grad_scaler.is_null());
}

// The tracker's "release" names the folder release/, whose state starts at iteration 0
// (megatron/training/checkpointing.py read_metadata, get_checkpoint_name, load_checkpoint).
TEST(MegatronCheckpointState, ReleaseIsIterationZeroOfTheReleaseFolder) {
  const std::string dir = (reference_dir() / "llama_release").string();
  const CheckpointState s = read_checkpoint_metadata(dir, kReleaseIteration);
  EXPECT_TRUE(s.release);
  EXPECT_EQ(s.iteration, 0);
  EXPECT_EQ(checkpoint_iteration_dir(dir, kReleaseIteration), (fs::path(dir) / "release").string());
  EXPECT_FALSE(read_checkpoint_metadata((reference_dir() / "llama_mcore").string(), 7).release);
}

}  // namespace
}  // namespace tessera
