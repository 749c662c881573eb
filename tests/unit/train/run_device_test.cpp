// What a run asks of its device at start-up: every op training_ops names is a real op (the
// CPU backend has each), the optimizer's update and the sequence-parallel layout ops follow
// the flags, and the start-up line names a device other than the CPU with its memory.
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

bool has(const std::vector<std::string_view>& ops, std::string_view op) {
  return std::find(ops.begin(), ops.end(), op) != ops.end();
}

TEST(TrainingOps, AreOpsTheCpuBackendHas) {
  TrainArgs args;
  args.sequence_parallel = true;
  for (std::string_view op : tessera::training_ops(args))
    EXPECT_TRUE(tessera::ops::supports(tessera::cpu_device(), op)) << op;
  EXPECT_NO_THROW(tessera::ops::check_supported(tessera::open_device("strict"), tessera::training_ops(args)));
}

// The strict device runs only the ops a run declared at start-up: an op outside the list
// fails there, naming it. Each case runs in a child process (a declaration lasts for the
// process, and the other tests here run ops on strict undeclared).
void run_after_declaring(const std::vector<std::string_view>& declared) {
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
  EXPECT_EXIT(run_after_declaring({"fill", "scale_inplace"}), testing::ExitedWithCode(0), "");
  EXPECT_EXIT(run_after_declaring({"fill"}), testing::ExitedWithCode(1),
              "op scale_inplace ran on device strict but the run did not declare it at start-up");
}

TEST(TrainingOps, FollowTheFlags) {
  TrainArgs adam;
  EXPECT_TRUE(has(tessera::training_ops(adam), "multi_tensor_adamw"));
  EXPECT_FALSE(has(tessera::training_ops(adam), "multi_tensor_sgd"));
  EXPECT_FALSE(has(tessera::training_ops(adam), "sequence_to_rank_major"));
  TrainArgs sgd_sp;
  sgd_sp.optimizer.kind = tessera::OptimizerKind::SGD;
  sgd_sp.sequence_parallel = true;
  EXPECT_TRUE(has(tessera::training_ops(sgd_sp), "multi_tensor_sgd"));
  EXPECT_FALSE(has(tessera::training_ops(sgd_sp), "multi_tensor_adamw"));
  EXPECT_TRUE(has(tessera::training_ops(sgd_sp), "rank_major_to_sequence"));
  EXPECT_FALSE(has(tessera::training_ops(adam), "convert"));
  TrainArgs llama;
  llama.bf16 = true;
  llama.model.normalization = tessera::Normalization::RMSNorm;
  llama.model.swiglu = true;
  llama.model.position_embedding = tessera::PositionEmbedding::Rope;
  llama.model.add_bias_linear = false;
  llama.model.num_attention_heads = 4;
  llama.model.kv_channels = 8;
  for (std::string_view op : {"rmsnorm_backward", "swiglu_forward", "attention_qkv_backward", "convert"})
    EXPECT_TRUE(has(tessera::training_ops(llama), op)) << op;
  for (std::string_view op : {"layernorm_forward", "gelu_forward", "bias_add_forward"})
    EXPECT_FALSE(has(tessera::training_ops(llama), op)) << op;
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
