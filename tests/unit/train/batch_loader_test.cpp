// The prefetching loader returns exactly the samples Megatron's sampler assigns (in order,
// DP rank r's slice of each micro-batch block), whether or not the batch was prefetched,
// and reports a failing sample source for the batch that needed it.
#include <gtest/gtest.h>

#include <atomic>
#include <stdexcept>

#include "tessera/train/batch_loader.h"

using namespace tessera;

namespace {
// Sample i is [i*1000, i*1000+1, ...], so every token names its sample.
class Numbered final : public SampleSource {
 public:
  explicit Numbered(int seq, int64_t fail_at = -1) : seq_(seq), fail_at_(fail_at) {}
  void fill(int64_t index, int32_t* tokens) override {
    if (index == fail_at_) throw std::runtime_error("sample " + std::to_string(index) + " unreadable");
    ++calls;
    for (int t = 0; t <= seq_; ++t) tokens[t] = static_cast<int32_t>(index * 1000 + t);
  }
  std::atomic<int> calls{0};

 private:
  int seq_;
  int64_t fail_at_;
};
}  // namespace

TEST(BatchLoader, FollowsMegatronsSamplerForEveryDataParallelRank) {
  // mbs 2, 3 micro-batches, DP 2: blocks of 4 samples; rank 1 takes positions 2,3 of each.
  SamplerLayout layout{2, 3, 2, 1};
  Numbered source(4);
  BatchLoader loader(source, 4, layout);
  for (int64_t consumed : {0, 12, 24, 100}) {  // 100: a jump (resume), not prefetched
    const auto& batch = loader.global_batch(consumed);
    ASSERT_EQ(batch.size(), 6u * 5u);
    const int64_t expected[] = {2, 3, 6, 7, 10, 11};
    for (int row = 0; row < 6; ++row) {
      EXPECT_EQ(batch[row * 5], (consumed + expected[row]) * 1000) << "consumed " << consumed << " row " << row;
      EXPECT_EQ(batch[row * 5 + 4], (consumed + expected[row]) * 1000 + 4);
    }
  }
}

TEST(BatchLoader, PrefetchFailureSurfacesOnlyForTheBatchThatNeedsIt) {
  SamplerLayout layout{2, 1, 1, 0};
  Numbered source(3, /*fail_at=*/3);
  BatchLoader loader(source, 3, layout);
  EXPECT_EQ(loader.global_batch(0)[0], 0);                 // prefetches [2, 4), which fails
  EXPECT_EQ(loader.global_batch(10)[0], 10 * 1000);        // a different batch is unaffected
  EXPECT_THROW(loader.global_batch(2), std::runtime_error);  // the failing batch reports it
}
