// The executor's slot plan: how many activation sets the model allocates per chunk. Under
// 1F1B stage r holds at most min(PP - r, M) micro-batches between forward and backward (the
// issue's "at most PP in flight"), the interleaved schedule what its warm-up implies, and
// the forward-only (evaluation) schedule one; I/O slots cover transfers still pending.
#include <gtest/gtest.h>

#include <algorithm>

#include "tessera/train/pipeline_executor.h"

namespace tessera {
namespace {

TEST(PipelineExecutor, OneFOneBKeepsAtMostPPMinusStageActivationSets) {
  for (int pp = 1; pp <= 8; ++pp)
    for (int m = 1; m <= 16; ++m)
      for (int r = 0; r < pp; ++r) {
        const PipelineSchedule s = make_pipeline_schedule(pp, 1, m);
        const PipelineExecutor e(s, r);
        SCOPED_TRACE("pp " + std::to_string(pp) + " m " + std::to_string(m) + " rank " + std::to_string(r));
        EXPECT_EQ(e.act_slots()[0], std::min(pp - r, m));
        EXPECT_EQ(e.act_slots()[0], s.max_in_flight(r, 0));
        EXPECT_LE(e.io_slots()[0], e.act_slots()[0] + 1);
      }
}

TEST(PipelineExecutor, InterleavedSlotsEqualTheScheduleInFlight) {
  for (int pp : {3, 4})
    for (int v : {2, 3})
      for (int m : {pp, 2 * pp, 4 * pp})
        for (int r = 0; r < pp; ++r) {
          const PipelineSchedule s = make_pipeline_schedule(pp, v, m);
          const PipelineExecutor e(s, r);
          for (int c = 0; c < v; ++c) {
            EXPECT_EQ(e.act_slots()[c], std::max(1, s.max_in_flight(r, c)));
            EXPECT_LE(e.act_slots()[c], m);
          }
        }
}

TEST(PipelineExecutor, ForwardOnlyNeedsOneActivationSet) {
  for (int pp = 1; pp <= 4; ++pp)
    for (int v : {1, 2})
      for (int r = 0; r < pp; ++r) {
        if (v > 1 && pp == 1) continue;
        const PipelineExecutor e(make_forward_only_schedule(pp, v, 8), r);
        for (int c = 0; c < v; ++c) {
          EXPECT_EQ(e.act_slots()[c], 1);
          EXPECT_EQ(e.io_slots()[c], 1);
        }
      }
}

}  // namespace
}  // namespace tessera
