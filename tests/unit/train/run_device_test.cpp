// What a run asks of its device at start-up: every op training_ops names is a real op (the
// CPU backend has each), the optimizer's update and the sequence-parallel layout ops follow
// the flags, and the start-up line names a device other than the CPU with its memory.
#include <gtest/gtest.h>

#include <algorithm>

#include "tessera/device/registry.h"
#include "tessera/ops/kernel_table.h"
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

TEST(TrainingOps, FollowTheFlags) {
  TrainArgs adam;
  EXPECT_TRUE(has(tessera::training_ops(adam), "adamw_update"));
  EXPECT_FALSE(has(tessera::training_ops(adam), "sgd_update"));
  EXPECT_FALSE(has(tessera::training_ops(adam), "sequence_to_rank_major"));
  TrainArgs sgd_sp;
  sgd_sp.optimizer.kind = tessera::OptimizerKind::SGD;
  sgd_sp.sequence_parallel = true;
  EXPECT_TRUE(has(tessera::training_ops(sgd_sp), "sgd_update"));
  EXPECT_FALSE(has(tessera::training_ops(sgd_sp), "adamw_update"));
  EXPECT_TRUE(has(tessera::training_ops(sgd_sp), "rank_major_to_sequence"));
}

TEST(RunDeviceLine, NamesTheDeviceAndItsMemory) {
  EXPECT_EQ(tessera::run_device_line(tessera::cpu_device()).rfind("device: cpu (", 0), 0u);
  const std::string strict = tessera::run_device_line(tessera::open_device("strict"));
  EXPECT_EQ(strict.rfind("device: strict, ", 0), 0u) << strict;
  EXPECT_NE(strict.find(" GiB memory"), std::string::npos) << strict;
}

}  // namespace
