// ops/op_profile.h: while on, each call through an op's dispatch counts once for its op;
// off, nothing counts; switching on clears the totals.
#include <gtest/gtest.h>

#include <vector>

#include "tessera/core/tensor.h"
#include "tessera/device/device.h"
#include "tessera/device/registry.h"
#include "tessera/ops/kernel_table.h"
#include "tessera/ops/op_profile.h"
#include "tessera/ops/ops.h"

using namespace tessera;

namespace {

int64_t calls_of(ops::OpId op) {
  for (const ops::OpTime& o : ops::op_profile())
    if (o.op == op) return o.calls;
  return 0;
}

TEST(OpProfile, CountsEachDispatchedCallWhileOn) {
  Device& cpu = open_device("cpu");
  Buffer buffer(cpu, 1024 * sizeof(float));
  const Tensor t = tensor_at(buffer, 0, DType::F32, {1024});
  const Tensor u = tensor_at(buffer, 0, DType::F32, {1024});

  ops::set_op_profile(false);
  ops::fill(t, 1.0f);  // off: not counted
  ops::set_op_profile(true);
  EXPECT_TRUE(ops::op_profile().empty());
  ops::fill(t, 0.5f);
  ops::fill(t, 0.25f);
  ops::scale_inplace(u, 2.0f);
  ops::set_op_profile(false);
  ops::fill(t, 0.0f);  // off again: not counted

  EXPECT_EQ(calls_of(ops::fill), 2);
  EXPECT_EQ(calls_of(ops::scale_inplace), 1);
  ASSERT_EQ(ops::op_profile().size(), 2u);
  for (const ops::OpTime& o : ops::op_profile()) {
    EXPECT_GE(o.cpu_ms, 0.0);
    EXPECT_GE(o.wall_ms, 0.0);
  }
}

}  // namespace
