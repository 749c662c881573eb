// Data parallelism over the gradient and parameter buffers: buckets cut from the end of the
// buffer, each averaged across the group exactly once per step, whether launched early
// (overlap, as backward reports parameters ready) or after backward; with the distributed
// optimizer a reduce-scatter leaves each rank its owned ranges, the gradient gather gives every
// rank the whole reduced gradients, the parameter gather the owners' values, and checkpoint
// state travels through host buffers; an overlapped gather still running when the buckets are
// destroyed is finished first; in --deterministic-mode the sums take the canonical order.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <memory>
#include <thread>
#include <tuple>
#include <vector>

#include "tessera/comm/in_process/in_process_communicator.h"
#include "tessera/device/device.h"
#include "tessera/parallel/data_parallel.h"

using namespace tessera;

namespace {

const std::vector<int64_t> kSizes = {3, 5, 2, 7, 4};

// A rank's two buffers laid out by `layout`.
struct Buffers {
  GradBufferLayout layout;
  Buffer grad_slab, param_slab;
  Tensor grads, params;
  explicit Buffers(GradBufferLayout l)
      : layout(std::move(l)),
        grad_slab(cpu_device(), layout.numel * sizeof(float)),
        param_slab(cpu_device(), layout.numel * sizeof(float)),
        grads(tensor_at(grad_slab, 0, DType::F32, {layout.numel})),
        params(tensor_at(param_slab, 0, DType::F32, {layout.numel})) {}
  float& grad(size_t p, int64_t e) { return grads.f32()[layout.params[p].start + e]; }
  float& param(size_t p, int64_t e) { return params.f32()[layout.params[p].start + e]; }
};

GradBufferLayout layout_for(int dp, int64_t bucket_size, bool distributed) {
  GradBufferOptions o;
  o.data_parallel = dp;
  o.bucket_size = bucket_size;
  o.distributed_optimizer = distributed;
  o.dense_alignment = 1;  // Megatron's dense packing: bucket sizes count elements only
  return build_grad_buffer_layout(kSizes, o);
}

// Every rank's gradient of (p, e) is rank*100 + p*10 + e; the mean over ranks 0..n-1 is
// (n-1)*50 + p*10 + e, exact in f32.
void fill_grads(Buffers& b, int rank) {
  for (size_t p = 0; p < kSizes.size(); ++p)
    for (int64_t e = 0; e < kSizes[p]; ++e) b.grad(p, e) = float(rank * 100 + p * 10 + e);
}

void report_backward(DataParallelBuckets& buckets) {
  // Backward reports the last parameters first.
  buckets.mark_ready(3, 5);
  buckets.mark_ready(1, 3);
  buckets.mark_ready(0, 1);
}

void check_average(bool overlap, int64_t bucket_size, size_t expected_buckets) {
  run_in_process_ranks(4, [&](Communicator& dp) {
    Buffers b(layout_for(4, bucket_size, false));
    DataParallelBuckets buckets(b.layout, b.grads, b.params, dp, {overlap, false, false}, cpu_device());
    EXPECT_EQ(buckets.num_buckets(), expected_buckets);
    for (int step = 0; step < 2; ++step) {  // twice: buckets re-arm after finish()
      fill_grads(b, dp.rank());
      report_backward(buckets);
      buckets.finish();
      for (size_t p = 0; p < kSizes.size(); ++p)
        for (int64_t e = 0; e < kSizes[p]; ++e) ASSERT_EQ(b.grad(p, e), float(150 + p * 10 + e)) << p << " " << e;
    }
  });
}

}  // namespace

TEST(DataParallelBuckets, OneBucketAfterBackward) { check_average(false, INT64_MAX, 1); }

TEST(DataParallelBuckets, OverlappedBucketsCutFromTheEnd) {
  // At least 8 elements per bucket, from the end: params [3,5) (4+7), then [0,3) (2+5+3).
  check_average(true, 8, 2);
  check_average(true, 1, 5);  // one bucket per parameter
}

// Each rank ends with the mean of exactly its owned ranges, the pieces cover every element
// once over the ranks, gathering the gradients gives every rank the whole mean, and after the
// owners write their values every rank holds them all.
void check_distributed(int dp_size, int64_t bucket_size, bool overlap_gather) {
  run_in_process_ranks(dp_size, [&](Communicator& dp) {
    Buffers b(layout_for(dp_size, bucket_size, true));
    DataParallelBuckets buckets(b.layout, b.grads, b.params, dp, {true, true, overlap_gather}, cpu_device());
    const float base = float((dp_size - 1) * 50);
    for (int step = 0; step < 2; ++step) {
      fill_grads(b, dp.rank());
      report_backward(buckets);
      buckets.finish();
      int64_t owned = 0;
      for (const DataParallelBuckets::OwnedPiece& piece : buckets.owned_pieces()) {
        ASSERT_EQ(piece.grad.numel(), piece.end - piece.begin);
        // Scaled by 1/DP before the sum, as Megatron: exact for DP 1, 2, 4, a rounding off for 3.
        for (int64_t e = piece.begin; e < piece.end; ++e)
          EXPECT_NEAR(piece.grad.f32()[e - piece.begin], base + float(piece.param * 10 + e), 1e-4)
              << piece.param << " " << e;
        // The owner "updates" its piece: the parameter's element count plus the step.
        for (int64_t e = piece.begin; e < piece.end; ++e)
          piece.value.f32()[e - piece.begin] = float(1000 * step + piece.param * 10 + e);
        owned += piece.end - piece.begin;
      }
      int64_t total = owned;
      dp.all_reduce(Tensor(&total, DType::I64, {1}, nullptr), ReduceOp::Sum);
      EXPECT_EQ(total, 21);  // 3 + 5 + 2 + 7 + 4: every element owned once
      fill_grads(b, dp.rank());  // the gather overwrites every element
      buckets.gather_grads();
      for (size_t p = 0; p < kSizes.size(); ++p)
        for (int64_t e = 0; e < kSizes[p]; ++e)
          EXPECT_NEAR(b.grad(p, e), base + float(p * 10 + e), 1e-4) << p << " " << e;
      buckets.gather_params();
      buckets.wait_params(0, kSizes.size());
      for (size_t p = 0; p < kSizes.size(); ++p)
        for (int64_t e = 0; e < kSizes[p]; ++e) EXPECT_EQ(b.param(p, e), float(1000 * step + p * 10 + e));
    }
  });
}

TEST(DataParallelBuckets, DistributedOptimizerReduceScatterAndGather) {
  check_distributed(2, INT64_MAX, false);
  check_distributed(3, INT64_MAX, false);
  check_distributed(4, 8, true);  // several buckets, gathers waited for lazily
  check_distributed(1, INT64_MAX, false);
}

// --deterministic-mode: ranks holding 1e8, 1e8, 3, 7 in every element average to
// ((1e8 + 1e8) + (3 + 7)) / 4 = 5e7 + 4, the canonical order of comm/ordered_sum.h summed before
// the scale; the backend's rank-order sum of scaled values gives 5e7 (f32 spacing 4 there).
// The all-reduce in one bucket and in overlapped buckets, and the distributed optimizer's
// reduce-scatter, whose gathered gradients (its --deterministic-mode norm) are the all-reduce's.
TEST(DataParallelBuckets, DeterministicModeSumsInTheCanonicalOrder) {
  const float mine[4] = {1e8f, 1e8f, 3.f, 7.f};
  cpu_device().set_deterministic_mode(true);
  for (const auto& [overlap, distributed, bucket_size] :
       {std::tuple{false, false, INT64_MAX}, std::tuple{true, false, int64_t{8}}, std::tuple{true, true, int64_t{8}}})
    run_in_process_ranks(4, [&](Communicator& dp) {
      Buffers b(layout_for(4, bucket_size, distributed));
      DataParallelBuckets buckets(b.layout, b.grads, b.params, dp, {overlap, distributed, false}, cpu_device());
      for (size_t p = 0; p < kSizes.size(); ++p)
        for (int64_t e = 0; e < kSizes[p]; ++e) b.grad(p, e) = mine[dp.rank()];
      report_backward(buckets);
      buckets.finish();
      if (distributed) buckets.gather_grads();
      for (size_t p = 0; p < kSizes.size(); ++p)
        for (int64_t e = 0; e < kSizes[p]; ++e) ASSERT_EQ(b.grad(p, e), 5e7f + 4.f) << p << " " << e;
      for (const DataParallelBuckets::OwnedPiece& piece : buckets.owned_pieces())
        for (int64_t i = 0; i < piece.grad.numel(); ++i) ASSERT_EQ(piece.grad.f32()[i], 5e7f + 4.f) << piece.param;
    });
  cpu_device().set_deterministic_mode(false);
}

TEST(DataParallelBuckets, OptimizerStateThroughHostBuffers) {
  run_in_process_ranks(3, [&](Communicator& dp) {
    Buffers b(layout_for(3, 8, true));
    DataParallelBuckets buckets(b.layout, b.grads, b.params, dp, {true, true, false}, cpu_device());
    // A state tensor per piece holding its elements' global identity.
    std::vector<std::vector<float>> state;
    std::vector<Tensor> pieces;
    for (const DataParallelBuckets::OwnedPiece& piece : buckets.owned_pieces()) {
      state.emplace_back();
      for (int64_t e = piece.begin; e < piece.end; ++e) state.back().push_back(float(piece.param * 10 + e));
    }
    for (auto& s : state) pieces.push_back(Tensor(s.data(), DType::F32, {int64_t(s.size())}, &cpu_device()));
    std::vector<float> whole(b.layout.numel, -1.0f);
    buckets.gather_to_host(whole.data(), pieces);
    for (size_t p = 0; p < kSizes.size(); ++p)
      for (int64_t e = 0; e < kSizes[p]; ++e) ASSERT_EQ(whole[b.layout.params[p].start + e], float(p * 10 + e));
    for (auto& s : state) std::fill(s.begin(), s.end(), 0.0f);
    buckets.scatter_from_host(pieces, whole.data());
    for (size_t j = 0; j < buckets.owned_pieces().size(); ++j) {
      const DataParallelBuckets::OwnedPiece& piece = buckets.owned_pieces()[j];
      for (int64_t e = piece.begin; e < piece.end; ++e)
        ASSERT_EQ(state[j][e - piece.begin], float(piece.param * 10 + e));
    }
  });
}

// The exit-time crash: with --overlap-param-gather the last step's gathers run in the
// background, and the model freed the buffers they write into while they still ran. The
// buckets' destructor must finish them. Rank 1 joins the gather only once rank 0 has
// destroyed its buckets (or after a grace period, in which a destructor that waits is still
// waiting), so rank 0's gather is certainly unfinished when its destructor starts: rank 0's
// parameters are whole right after the destructor returns only if it waited.
TEST(DataParallelBuckets, DestroyingFinishesAnOverlappedGather) {
  std::atomic<bool> destroyed{false};
  run_in_process_ranks(2, [&](Communicator& dp) {
    Buffers b(layout_for(2, 8, true));
    {
      DataParallelBuckets buckets(b.layout, b.grads, b.params, dp, {true, true, true}, cpu_device());
      fill_grads(b, dp.rank());
      report_backward(buckets);
      buckets.finish();
      for (const DataParallelBuckets::OwnedPiece& piece : buckets.owned_pieces())
        for (int64_t e = piece.begin; e < piece.end; ++e) piece.value.f32()[e - piece.begin] = float(piece.param * 10 + e);
      if (dp.rank() == 1) {
        const auto grace = std::chrono::steady_clock::now() + std::chrono::milliseconds(300);
        while (!destroyed && std::chrono::steady_clock::now() < grace)
          std::this_thread::sleep_for(std::chrono::milliseconds(1));
      }
      buckets.gather_params();
    }
    if (dp.rank() == 0) {
      for (size_t p = 0; p < kSizes.size(); ++p)
        for (int64_t e = 0; e < kSizes[p]; ++e) EXPECT_EQ(b.param(p, e), float(p * 10 + e)) << p << " " << e;
      destroyed = true;
    }
    dp.barrier();  // waits for the queued gathers either way, before the buffers go
  });
}

// Expert parallelism (world 4 = EP 2 x expert DP 2): the experts' buckets (parameters 1 and 3)
// are summed over the expert data-parallel group ([0,2] [1,3]) and scaled by 1/DP like the
// others, which are averaged over all four; with the distributed optimizer the experts'
// buckets are owned and gathered over the expert group.
TEST(DataParallelBuckets, ExpertBucketsReduceOverTheExpertDataParallelGroup) {
  for (bool distributed : {false, true}) {
    run_in_process_ranks(4, [&](Communicator& dp) {
      std::unique_ptr<Communicator> expert_dp = dp.split({{0, 2}, {1, 3}}, "expert_dp");
      GradBufferOptions o;
      o.data_parallel = 4;
      o.expert_data_parallel = 2;
      o.distributed_optimizer = distributed;
      o.dense_alignment = 1;
      const std::vector<bool> expert = {false, true, false, true, false};
      Buffers b(build_grad_buffer_layout(kSizes, o, {}, {}, expert));
      DataParallelBuckets buckets(b.layout, b.grads, b.params, dp, {true, distributed, false}, cpu_device(),
                                  expert_dp.get());
      fill_grads(b, dp.rank());
      report_backward(buckets);
      buckets.finish();
      // Expert group of rank r: {r % 2, r % 2 + 2}; its gradients' sum / 4.
      const int first = dp.rank() % 2;
      auto expected = [&](size_t p, int64_t e) {
        if (!expert[p]) return float(150 + p * 10 + e);
        return float((first * 100 + (first + 2) * 100 + 2 * (p * 10 + e)) / 4.0);
      };
      if (!distributed) {
        for (size_t p = 0; p < kSizes.size(); ++p)
          for (int64_t e = 0; e < kSizes[p]; ++e) ASSERT_EQ(b.grad(p, e), expected(p, e)) << p << " " << e;
        return;
      }
      for (const DataParallelBuckets::OwnedPiece& piece : buckets.owned_pieces())
        for (int64_t e = piece.begin; e < piece.end; ++e)
          ASSERT_EQ(piece.grad.f32()[e - piece.begin], expected(piece.param, e)) << piece.param << " " << e;
      // Every rank's parameter values come back from their owners (the expert group's for experts).
      for (size_t p = 0; p < kSizes.size(); ++p)
        for (int64_t e = 0; e < kSizes[p]; ++e) b.param(p, e) = -1.0f;
      for (const DataParallelBuckets::OwnedPiece& piece : buckets.owned_pieces())
        for (int64_t e = piece.begin; e < piece.end; ++e)
          piece.value.f32()[e - piece.begin] = float(first * 1000 + piece.param * 10 + e) * (expert[piece.param] ? 1 : 0);
      buckets.gather_params();
      for (size_t p = 0; p < kSizes.size(); ++p)
        for (int64_t e = 0; e < kSizes[p]; ++e)
          ASSERT_EQ(b.param(p, e), expert[p] ? float(first * 1000 + p * 10 + e) : 0.0f) << p << " " << e;
    });
  }
}
