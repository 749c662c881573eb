// The cuBLASLt plan cache's key logic (ops/cuda/gemm_plan.h), on the CPU: a GEMM is planned
// once however often it runs, and a change in anything the plan depends on (shape, leading
// dimensions, dtypes, transposes, epilogue, compute type, operand alignment, batch) gets a plan of
// its own, so no call ever runs with another GEMM's descriptor.
#include <gtest/gtest.h>

#include <functional>
#include <vector>

#include "tessera/ops/cuda/gemm_plan.h"

using namespace tessera::ops::cuda;

namespace {

// A stand-in for cuBLASLt's plan: the key it was made for.
struct FakePlan {
  GemmKey made_for;
};

// cudaDataType_t / cublasComputeType_t values, as the header leaves them opaque.
constexpr int kR32F = 0, kR16BF = 14, kCompute32F = 68, kCompute32FFastTF32 = 77;

GemmKey linear_forward_key() {
  // inp[8,64] @ W[32,64]^T + bias, all f32, 256-byte aligned.
  return GemmKey{kCompute32F, kR32F, kR32F, false, true, true, 8, 32, 64, 64, 64, 32, 256, 256, 256};
}

}  // namespace

TEST(GemmPlanCache, PlansEachGemmOnce) {
  PlanCache<FakePlan> cache;
  int made = 0;
  auto make = [&](const GemmKey& k) {
    return [&made, k] {
      ++made;
      return std::make_unique<FakePlan>(FakePlan{k});
    };
  };
  const GemmKey key = linear_forward_key();
  FakePlan& first = cache.get(key, make(key));
  for (int step = 0; step < 100; ++step) EXPECT_EQ(&cache.get(key, make(key)), &first);
  EXPECT_EQ(made, 1);
  EXPECT_EQ(cache.size(), 1u);
}

TEST(GemmPlanCache, EveryFieldThePlanDependsOnMakesANewPlan) {
  const GemmKey base = linear_forward_key();
  std::vector<std::function<void(GemmKey&)>> changes = {
      [](GemmKey& k) { k.compute = kCompute32FFastTF32; },  // --tf32
      [](GemmKey& k) { k.ab = kR16BF; },
      [](GemmKey& k) { k.ct = kR16BF; },
      [](GemmKey& k) { k.ta = true; },
      [](GemmKey& k) { k.tb = false; },
      [](GemmKey& k) { k.bias = false; },
      [](GemmKey& k) { k.M = 16; },
      [](GemmKey& k) { k.N = 64; },
      [](GemmKey& k) { k.K = 128; },
      [](GemmKey& k) { k.lda = 128; },
      [](GemmKey& k) { k.ldb = 128; },
      [](GemmKey& k) { k.ldc = 64; },
      [](GemmKey& k) { k.align_a = 16; },
      [](GemmKey& k) { k.align_b = 16; },
      [](GemmKey& k) { k.align_c = 4; },
      [](GemmKey& k) { k.batch = 12; },  // attention's heads
      [](GemmKey& k) { k.stride_a = 512; },
      [](GemmKey& k) { k.stride_b = 512; },
      [](GemmKey& k) { k.stride_c = 256; },
      [](GemmKey& k) { k.gelu_aux = true; },  // linear_bias_gelu_forward's epilogue
  };
  PlanCache<FakePlan> cache;
  cache.get(base, [&] { return std::make_unique<FakePlan>(FakePlan{base}); });
  for (size_t i = 0; i < changes.size(); ++i) {
    GemmKey k = base;
    changes[i](k);
    EXPECT_NE(k, base) << "change " << i;
    bool made = false;
    FakePlan& plan = cache.get(k, [&] {
      made = true;
      return std::make_unique<FakePlan>(FakePlan{k});
    });
    EXPECT_TRUE(made) << "change " << i << " reused another GEMM's plan";
    EXPECT_EQ(plan.made_for, k) << "change " << i;
  }
  EXPECT_EQ(cache.size(), changes.size() + 1);
  // The first plan is still the base key's.
  EXPECT_EQ(cache.get(base, [] { return std::unique_ptr<FakePlan>(); }).made_for, base);
}

TEST(GemmPlanCache, AlignmentIsTheLargestPowerOfTwoUpTo256) {
  alignas(256) static char buffer[1024];
  EXPECT_EQ(alignment_of(nullptr), 256u);
  EXPECT_EQ(alignment_of(buffer), 256u);
  EXPECT_EQ(alignment_of(buffer + 512), 256u);  // capped: cuBLASLt asks for at most 256
  EXPECT_EQ(alignment_of(buffer + 128), 128u);
  EXPECT_EQ(alignment_of(buffer + 4), 4u);
  EXPECT_EQ(alignment_of(buffer + 2), 2u);  // a bf16 element offset
  EXPECT_EQ(alignment_of(buffer + 96), 32u);
}

// A strided batch's matrices are as aligned as the first address and the stride allow: an
// odd f32 stride (a head of 19 x 8 bf16 values, say) leaves only the element's alignment.
TEST(GemmPlanCache, BatchAlignmentIsTheLeastOfAddressAndStride) {
  alignas(256) static char buffer[1024];
  EXPECT_EQ(batch_alignment(buffer, 0), 256u);  // no batch: the address's
  EXPECT_EQ(batch_alignment(buffer, 19 * 8 * 4), 32u);
  EXPECT_EQ(batch_alignment(buffer, 19 * 19 * 4), 4u);
  EXPECT_EQ(batch_alignment(buffer + 16, 1024 * 64 * 4), 16u);  // the address's
  EXPECT_EQ(batch_alignment(buffer, 19 * 2), 2u);
}
