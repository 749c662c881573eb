// Gradient buckets: cut from the end of the slab, each averaged across the data-parallel
// group exactly once per step, whether launched early (overlap, as backward reports
// parameters ready) or after backward.
#include <gtest/gtest.h>

#include <vector>

#include "tessera/comm/in_process/in_process_communicator.h"
#include "tessera/device/device.h"
#include "tessera/parallel/data_parallel.h"

using namespace tessera;

namespace {
// Five "parameters" of sizes 3, 5, 2, 7, 4 in one slab with 64-byte alignment gaps.
struct Grads {
  Buffer slab;
  std::vector<Tensor> tensors;
  Grads() {
    const std::vector<int64_t> sizes = {3, 5, 2, 7, 4};
    SlabBuilder layout;
    std::vector<size_t> offsets;
    for (int64_t n : sizes) offsets.push_back(layout.reserve(DType::F32, {n}));
    slab = Buffer(cpu_device(), layout.total_bytes());
    for (size_t i = 0; i < sizes.size(); ++i) tensors.push_back(tensor_at(slab, offsets[i], DType::F32, {sizes[i]}));
  }
};

void check_average(bool overlap, int64_t bucket_elements, size_t expected_buckets) {
  run_in_process_ranks(3, [&](Communicator& dp) {
    Grads g;
    GradBuckets buckets(g.tensors, dp, bucket_elements, overlap);
    EXPECT_EQ(buckets.num_buckets(), expected_buckets);
    for (int step = 0; step < 2; ++step) {  // twice: buckets re-arm after finish()
      for (size_t p = 0; p < g.tensors.size(); ++p)
        for (int64_t e = 0; e < g.tensors[p].numel(); ++e) g.tensors[p].f32()[e] = float(dp.rank() * 100 + p * 10 + e);
      // Backward reports the last parameters first.
      buckets.mark_ready(3, 5);
      buckets.mark_ready(1, 3);
      buckets.mark_ready(0, 1);
      buckets.finish();
      // Mean over ranks 0, 1, 2 of rank*100 + p*10 + e is 100 + p*10 + e.
      for (size_t p = 0; p < g.tensors.size(); ++p)
        for (int64_t e = 0; e < g.tensors[p].numel(); ++e)
          ASSERT_EQ(g.tensors[p].f32()[e], float(100 + p * 10 + e)) << "param " << p << " element " << e;
    }
  });
}
}  // namespace

TEST(GradBuckets, OneBucketAfterBackward) { check_average(false, INT64_MAX, 1); }

TEST(GradBuckets, OverlappedBucketsCutFromTheEnd) {
  // At least 8 elements per bucket, from the end: params [3,5) (4+7), then [0,3) (2+5+3).
  check_average(true, 8, 2);
  check_average(true, 1, 5);  // one bucket per parameter
}
