// What a run asks of its device at start-up: every op training_ops names is a real op (the
// CPU backend has each), the optimizer's update, the sequence-parallel layout ops and the
// fused epilogues follow the flags and the device's mode, and the start-up line names a
// device other than the CPU with its memory.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>

#include "tessera/device/registry.h"
#include "tessera/ops/kernel_table.h"
#include "tessera/ops/ops.h"
#include "tessera/train/arguments.h"
#include "tessera/train/run_device.h"

namespace {

using tessera::TrainArgs;

bool has(const std::vector<tessera::ops::OpId>& ops, std::string_view op) {
  return std::find(ops.begin(), ops.end(), tessera::ops::op_named(op)) != ops.end();
}

TEST(TrainingOps, AreOpsTheCpuBackendHas) {
  TrainArgs args;
  args.sequence_parallel = true;
  tessera::Device& strict = tessera::open_device("strict");
  for (tessera::ops::OpId op : tessera::training_ops(args, tessera::cpu_device()))
    EXPECT_TRUE(tessera::ops::supports(tessera::cpu_device(), op)) << tessera::ops::op_name(op);
  EXPECT_NO_THROW(tessera::ops::check_supported(strict, tessera::training_ops(args, strict)));
}

// The strict device runs only the ops a run declared at start-up: an op outside the list
// fails there, naming it. Each case runs in a child process (a declaration lasts for the
// process, and the other tests here run ops on strict undeclared).
void run_after_declaring(const std::vector<tessera::ops::OpId>& declared) {
  tessera::Device& strict = tessera::open_device("strict");
  tessera::ops::check_supported(strict, declared);
  tessera::Buffer buffer(strict, 4 * sizeof(float));
  const tessera::Tensor t(buffer.handle(), 0, tessera::DType::F32, {4}, &strict);
  tessera::ops::fill(t, 1.0f);
  try {
    tessera::ops::scale_inplace(t, 2.0f);
  } catch (const tessera::Error& e) {
    std::fprintf(stderr, "%s\n", e.what());
    std::exit(1);
  }
  std::exit(0);
}

TEST(StrictDeviceDeathTest, RunsOnlyTheDeclaredOps) {
  EXPECT_EXIT(run_after_declaring({tessera::ops::fill, tessera::ops::scale_inplace}), testing::ExitedWithCode(0), "");
  EXPECT_EXIT(run_after_declaring({tessera::ops::fill}), testing::ExitedWithCode(1),
              "op scale_inplace ran on device strict but the run did not declare it at start-up");
}

TEST(TrainingOps, FollowTheFlags) {
  const tessera::Device& cpu = tessera::cpu_device();
  TrainArgs adam;
  EXPECT_TRUE(has(tessera::training_ops(adam, cpu), "multi_tensor_adamw"));
  EXPECT_FALSE(has(tessera::training_ops(adam, cpu), "multi_tensor_sgd"));
  EXPECT_FALSE(has(tessera::training_ops(adam, cpu), "sequence_to_rank_major"));
  TrainArgs sgd_sp;
  sgd_sp.optimizer.kind = tessera::OptimizerKind::SGD;
  sgd_sp.sequence_parallel = true;
  EXPECT_TRUE(has(tessera::training_ops(sgd_sp, cpu), "multi_tensor_sgd"));
  EXPECT_FALSE(has(tessera::training_ops(sgd_sp, cpu), "multi_tensor_adamw"));
  EXPECT_TRUE(has(tessera::training_ops(sgd_sp, cpu), "rank_major_to_sequence"));
  EXPECT_FALSE(has(tessera::training_ops(adam, cpu), "convert"));
  TrainArgs llama;
  llama.bf16 = true;
  llama.model.normalization = tessera::Normalization::RMSNorm;
  llama.model.swiglu = true;
  llama.model.position_embedding = tessera::PositionEmbedding::Rope;
  llama.model.add_bias_linear = false;
  llama.model.num_attention_heads = 4;
  llama.model.kv_channels = 8;
  for (std::string_view op : {"rmsnorm_backward", "swiglu_forward", "flash_attention_backward", "convert"})
    EXPECT_TRUE(has(tessera::training_ops(llama, cpu), op)) << op;
  for (std::string_view op : {"layernorm_forward", "gelu_forward", "bias_add_forward", "attention_qkv_backward"})
    EXPECT_FALSE(has(tessera::training_ops(llama, cpu), op)) << op;
}

// The fused attention by default; --deterministic-mode keeps the unfused ops (and the grouped
// layout's regrouping for Llama), so the strict device would catch either list being wrong.
TEST(TrainingOps, AttentionFollowsTheDeviceMode) {
  TrainArgs llama;
  llama.model.position_embedding = tessera::PositionEmbedding::Rope;
  llama.model.num_attention_heads = 4;
  llama.model.kv_channels = 8;
  tessera::Device& strict = tessera::open_device("strict");
  const auto fused = tessera::training_ops(llama, strict);
  EXPECT_TRUE(has(fused, "flash_attention_forward"));
  EXPECT_FALSE(has(fused, "attention_forward"));
  strict.set_deterministic_mode(true);
  const auto unfused = tessera::training_ops(llama, strict);
  strict.set_deterministic_mode(false);
  for (std::string_view op : {"attention_buffers", "attention_forward", "attention_backward", "attention_qkv_forward"})
    EXPECT_TRUE(has(unfused, op)) << op;
  EXPECT_FALSE(has(unfused, "flash_attention_forward"));
}

// The fused epilogues replace unfused ops outside --deterministic-mode only, GeLU's only
// without SwiGLU, and only where the device has them (the CPU backend, which strict runs, has
// all).
TEST(TrainingOps, FusedEpiloguesFollowTheDeviceModeAndTheModel) {
  tessera::Device& strict = tessera::open_device("strict");
  const std::vector<std::string_view> epilogues = {"bias_dropout_add_forward", "bias_dropout_add_backward",
                                                   "linear_bias_gelu_forward", "linear_bias_gelu_backward"};
  TrainArgs gpt;
  for (std::string_view op : epilogues) EXPECT_TRUE(has(tessera::training_ops(gpt, strict), op)) << op;
  TrainArgs swiglu;
  swiglu.model.swiglu = true;
  EXPECT_TRUE(has(tessera::training_ops(swiglu, strict), "bias_dropout_add_forward"));
  EXPECT_FALSE(has(tessera::training_ops(swiglu, strict), "linear_bias_gelu_forward"));
  strict.set_deterministic_mode(true);
  const auto unfused = tessera::training_ops(gpt, strict);
  strict.set_deterministic_mode(false);
  for (std::string_view op : epilogues) EXPECT_FALSE(has(unfused, op)) << op;
}

// The loss's one-pass statistics with an unsharded vocabulary, in either mode (the same bits);
// a sharded one all-reduces between cross_entropy_max and _sums.
TEST(TrainingOps, CrossEntropyStatsFollowTheTensorParallelSize) {
  tessera::Device& strict = tessera::open_device("strict");
  TrainArgs whole;
  EXPECT_TRUE(has(tessera::training_ops(whole, strict), "cross_entropy_stats"));
  strict.set_deterministic_mode(true);
  EXPECT_TRUE(has(tessera::training_ops(whole, strict), "cross_entropy_stats"));
  strict.set_deterministic_mode(false);
  TrainArgs sharded;
  sharded.tensor_parallel_size = 2;
  EXPECT_FALSE(has(tessera::training_ops(sharded, strict), "cross_entropy_stats"));
}

TEST(RunDeviceLine, NamesTheDeviceAndItsMemory) {
  const std::string cpu = tessera::run_device_line(tessera::cpu_device());
  EXPECT_EQ(cpu.rfind("device: cpu (", 0), 0u) << cpu;
  EXPECT_NE(cpu.find(" GiB memory)"), std::string::npos) << cpu;
  const std::string strict = tessera::run_device_line(tessera::open_device("strict"));
  EXPECT_EQ(strict.rfind("device: strict, ", 0), 0u) << strict;
  EXPECT_NE(strict.find(" GiB memory"), std::string::npos) << strict;
}

}  // namespace
