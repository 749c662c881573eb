// Pipeline schedules without processes: a simulator runs every rank's step list together and
// holds each schedule (1F1B and interleaved, pp 1..8, V 1..4, micro-batches 1..16) to
// - matching: per ordered pair of ranks, the k-th send meets the k-th recv (the
//   communicator's FIFO rule) and both move the same tensor: SendForward of virtual stage s,
//   micro m fills RecvForward of stage s+1, micro m; SendBackward of s fills RecvBackward of
//   s-1;
// - progress: a compute step runs when its data is there, a p2p batch completes once the
//   peers have posted (reached) every counterpart; everything completes (no deadlock);
// - every forward and backward of every (virtual stage, micro) exactly once, forward before
//   backward, sends after the compute that produces their tensor;
// - max_in_flight equals the simulated peak, and is within min(pp - rank, M) for 1F1B.
// Plus Megatron's 1F1B order written out by hand for pp 4, M 6, and the usage errors.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>

#include "tessera/core/error.h"
#include "tessera/parallel/pipeline_schedule.h"

using namespace tessera;

namespace {

bool is_compute(PipeOp op) { return op == PipeOp::Forward || op == PipeOp::Backward; }
bool is_send(PipeOp op) { return op == PipeOp::SendForward || op == PipeOp::SendBackward; }

struct Where {
  int rank, step;
  const PipeAction* action;  // inside the schedule
};

std::string step_text(const PipeStep& step, int V) {
  std::string s;
  for (const PipeAction& a : step.actions) s += (s.empty() ? "" : " + ") + describe(a, V);
  return s;
}

// Runs the schedule; returns "" or what went wrong. peak[rank][chunk]: most forwards whose
// backward had not run.
std::string simulate(const PipelineSchedule& s, std::vector<std::vector<int>>& peak) {
  const int pp = s.pp, V = s.virtual_stages, M = s.num_micro, last_vs = pp * V - 1;
  auto text = [&](const Where& w) {
    return "rank " + std::to_string(w.rank) + " step " + std::to_string(w.step) + " (" +
           describe(*w.action, V) + ")";
  };
  if (static_cast<int>(s.ranks.size()) != pp) return "wrong number of ranks";

  // Pair every p2p action with its counterpart by FIFO order per (src, dst).
  std::map<std::pair<int, int>, std::vector<Where>> sends, recvs;
  for (int r = 0; r < pp; ++r)
    for (int i = 0; i < static_cast<int>(s.ranks[r].size()); ++i) {
      const auto& actions = s.ranks[r][i].actions;
      if (actions.empty()) return "rank " + std::to_string(r) + " step " + std::to_string(i) + " is empty";
      for (const PipeAction& a : actions) {
        const Where w{r, i, &a};
        if (a.chunk < 0 || a.chunk >= V || a.micro < 0 || a.micro >= M) return "out of range: " + text(w);
        if (is_compute(a.op)) {
          if (actions.size() != 1 || a.peer != -1) return "a compute action shares its step: " + text(w);
          continue;
        }
        if (a.peer < 0 || a.peer >= pp || a.peer == r) return "bad peer: " + text(w);
        if (is_send(a.op)) sends[{r, a.peer}].push_back(w);
        else recvs[{a.peer, r}].push_back(w);
      }
    }
  // The step of each p2p action's counterpart on its peer.
  std::map<const PipeAction*, int> counterpart;
  for (auto& [pair, list] : sends) {
    const auto& other = recvs[pair];
    for (size_t k = 0; k < list.size(); ++k) {
      if (k >= other.size()) return "no recv for " + text(list[k]);
      const Where &snd = list[k], &rcv = other[k];
      const int from = s.virtual_stage(snd.rank, snd.action->chunk), to = s.virtual_stage(rcv.rank, rcv.action->chunk);
      const bool fwd = snd.action->op == PipeOp::SendForward;
      if (rcv.action->op != (fwd ? PipeOp::RecvForward : PipeOp::RecvBackward) || to != from + (fwd ? 1 : -1) ||
          rcv.action->micro != snd.action->micro)
        return "message " + std::to_string(k) + " of pair " + std::to_string(pair.first) + "->" +
               std::to_string(pair.second) + ": " + text(snd) + " meets " + text(rcv);
      counterpart[snd.action] = rcv.step;
      counterpart[rcv.action] = snd.step;
    }
  }
  for (auto& [pair, list] : recvs)
    if (list.size() != sends[pair].size()) return "no send for " + text(list[sends[pair].size()]);

  // Run.
  std::vector<int> pc(pp, 0);
  // done[rank][chunk][micro]: forwards, backwards, inputs and output gradients received
  using Flags = std::vector<std::vector<std::vector<int>>>;
  Flags fwd(pp, std::vector<std::vector<int>>(V, std::vector<int>(M, 0))), bwd = fwd, input = fwd, grad = fwd;
  std::vector<std::vector<int>> live(pp, std::vector<int>(V, 0));
  peak.assign(pp, std::vector<int>(V, 0));
  for (bool progress = true; progress;) {
    progress = false;
    for (int r = 0; r < pp; ++r) {
      if (pc[r] == static_cast<int>(s.ranks[r].size())) continue;
      const auto& actions = s.ranks[r][pc[r]].actions;
      const PipeAction& a = actions.front();
      const Where w{r, pc[r], &a};
      const int vs = s.virtual_stage(r, a.chunk);
      if (a.op == PipeOp::Forward) {
        // The inputs come only from this rank's earlier steps: missing now is missing forever.
        if (vs > 0 && !input[r][a.chunk][a.micro]) return "forward without its input: " + text(w);
        if (fwd[r][a.chunk][a.micro]++) return "forward twice: " + text(w);
        peak[r][a.chunk] = std::max(peak[r][a.chunk], ++live[r][a.chunk]);
      } else if (a.op == PipeOp::Backward) {
        if (!fwd[r][a.chunk][a.micro]) return "backward before its forward: " + text(w);
        if (vs < last_vs && !grad[r][a.chunk][a.micro]) return "backward without its output gradient: " + text(w);
        if (bwd[r][a.chunk][a.micro]++) return "backward twice: " + text(w);
        --live[r][a.chunk];
      } else {
        bool ready = true;
        for (const PipeAction& b : actions) ready = ready && pc[b.peer] >= counterpart.at(&b);
        if (!ready) continue;
        for (const PipeAction& b : actions) {
          const Where wb{r, pc[r], &b};
          switch (b.op) {
            case PipeOp::SendForward:
              if (!fwd[r][b.chunk][b.micro]) return "send before its forward: " + text(wb);
              break;
            case PipeOp::SendBackward:
              if (!bwd[r][b.chunk][b.micro]) return "send before its backward: " + text(wb);
              break;
            case PipeOp::RecvForward:
              if (input[r][b.chunk][b.micro]++) return "input received twice: " + text(wb);
              break;
            case PipeOp::RecvBackward:
              if (grad[r][b.chunk][b.micro]++) return "gradient received twice: " + text(wb);
              break;
            default: break;
          }
        }
      }
      ++pc[r];
      progress = true;
    }
  }
  std::string stuck;
  for (int r = 0; r < pp; ++r)
    if (pc[r] < static_cast<int>(s.ranks[r].size()))
      stuck += "\n  rank " + std::to_string(r) + " waits at step " + std::to_string(pc[r]) + ": " +
               step_text(s.ranks[r][pc[r]], V);
  if (!stuck.empty()) return "deadlock:" + stuck;
  for (int r = 0; r < pp; ++r)
    for (int c = 0; c < V; ++c)
      for (int m = 0; m < M; ++m)
        if (fwd[r][c][m] != 1 || bwd[r][c][m] != 1)
          return "rank " + std::to_string(r) + " chunk " + std::to_string(c) + " micro " + std::to_string(m) +
                 " ran " + std::to_string(fwd[r][c][m]) + " forwards, " + std::to_string(bwd[r][c][m]) +
                 " backwards";
  return "";
}

void check_schedule(int pp, int V, int M) {
  SCOPED_TRACE("pp " + std::to_string(pp) + ", V " + std::to_string(V) + ", M " + std::to_string(M));
  const PipelineSchedule s = make_pipeline_schedule(pp, V, M);
  EXPECT_EQ(s.pp, pp);
  EXPECT_EQ(s.virtual_stages, V);
  EXPECT_EQ(s.num_micro, M);
  std::vector<std::vector<int>> peak;
  const std::string error = simulate(s, peak);
  ASSERT_EQ(error, "");
  for (int r = 0; r < pp; ++r)
    for (int c = 0; c < V; ++c) {
      EXPECT_EQ(s.max_in_flight(r, c), peak[r][c]) << "rank " << r << " chunk " << c;
      if (V == 1) {
        EXPECT_LE(s.max_in_flight(r, c), std::min(pp - r, M)) << "rank " << r;
      }
    }
}

std::string error_of(int pp, int V, int M) {
  try {
    make_pipeline_schedule(pp, V, M);
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::Usage);
    return std::string(e.what()) + "\nhint: " + e.hint();
  }
  return "(no error)";
}

}  // namespace

TEST(PipelineSchedule, OneFOneBRunsEverywhereWithoutDeadlock) {
  for (int pp = 1; pp <= 8; ++pp)
    for (int M = 1; M <= 16; ++M) check_schedule(pp, 1, M);
}

TEST(PipelineSchedule, InterleavedRunsEverywhereWithoutDeadlock) {
  int checked = 0;
  for (int pp = 2; pp <= 8; ++pp)
    for (int V = 2; V <= 4; ++V)
      for (int M = pp; M <= 16; M += pp, ++checked) check_schedule(pp, V, M);
  EXPECT_EQ(checked, 3 * (8 + 5 + 4 + 3 + 2 + 2 + 2));
}

// Megatron's forward_backward_pipelining_without_interleaving for pp 4, M 6: rank 0 warms up
// with 3 forwards, rank 1 with 2, the last rank starts 1F1B at once.
TEST(PipelineSchedule, OneFOneBMatchesMegatronsOrder) {
  const PipelineSchedule s = make_pipeline_schedule(4, 1, 6);
  EXPECT_EQ(describe(s, 0),
            "F m0\nsend_fwd m0 to 1\n"
            "F m1\nsend_fwd m1 to 1\n"
            "F m2\nsend_fwd m2 to 1\n"
            "F m3\nsend_fwd m3 to 1 + recv_bwd m0 from 1\nB m0\n"
            "F m4\nsend_fwd m4 to 1 + recv_bwd m1 from 1\nB m1\n"
            "F m5\nsend_fwd m5 to 1 + recv_bwd m2 from 1\nB m2\n"
            "recv_bwd m3 from 1\nB m3\n"
            "recv_bwd m4 from 1\nB m4\n"
            "recv_bwd m5 from 1\nB m5\n");
  EXPECT_EQ(describe(s, 1),
            "recv_fwd m0 from 0\nF m0\nsend_fwd m0 to 2\n"
            "recv_fwd m1 from 0\nF m1\nsend_fwd m1 to 2\n"
            "recv_fwd m2 from 0\n"
            "F m2\nsend_fwd m2 to 2 + recv_bwd m0 from 2\nB m0\nsend_bwd m0 to 0 + recv_fwd m3 from 0\n"
            "F m3\nsend_fwd m3 to 2 + recv_bwd m1 from 2\nB m1\nsend_bwd m1 to 0 + recv_fwd m4 from 0\n"
            "F m4\nsend_fwd m4 to 2 + recv_bwd m2 from 2\nB m2\nsend_bwd m2 to 0 + recv_fwd m5 from 0\n"
            "F m5\nsend_fwd m5 to 2 + recv_bwd m3 from 2\nB m3\nsend_bwd m3 to 0\n"
            "recv_bwd m4 from 2\nB m4\nsend_bwd m4 to 0\n"
            "recv_bwd m5 from 2\nB m5\nsend_bwd m5 to 0\n");
  EXPECT_EQ(describe(s, 3),
            "recv_fwd m0 from 2\n"
            "F m0\nB m0\nsend_bwd m0 to 2 + recv_fwd m1 from 2\n"
            "F m1\nB m1\nsend_bwd m1 to 2 + recv_fwd m2 from 2\n"
            "F m2\nB m2\nsend_bwd m2 to 2 + recv_fwd m3 from 2\n"
            "F m3\nB m3\nsend_bwd m3 to 2 + recv_fwd m4 from 2\n"
            "F m4\nB m4\nsend_bwd m4 to 2 + recv_fwd m5 from 2\n"
            "F m5\nB m5\nsend_bwd m5 to 2\n");
  EXPECT_EQ(s.max_in_flight(0, 0), 4);
  EXPECT_EQ(s.max_in_flight(1, 0), 3);
  EXPECT_EQ(s.max_in_flight(3, 0), 1);
}

TEST(PipelineSchedule, OneStageIsForwardThenBackwardPerMicroBatch) {
  const PipelineSchedule s = make_pipeline_schedule(1, 1, 3);
  EXPECT_EQ(describe(s, 0), "F m0\nB m0\nF m1\nB m1\nF m2\nB m2\n");
  EXPECT_EQ(s.max_in_flight(0, 0), 1);
}

// Interleaving with 2 ranks, 2 chunks, 4 micro-batches: groups of pp micro-batches go
// through chunk 0 then chunk 1; rank 0 warms up with (2-0-1)*2 + (2-1)*2 = 4 forwards.
TEST(PipelineSchedule, InterleavedWarmUpAndChunkOrderFollowMegatron) {
  const PipelineSchedule s = make_pipeline_schedule(2, 2, 4);
  std::vector<std::string> forwards, backwards;
  for (const PipeStep& step : s.ranks[0])
    for (const PipeAction& a : step.actions) {
      if (a.op == PipeOp::Forward) forwards.push_back(describe(a, 2));
      if (a.op == PipeOp::Backward) backwards.push_back(describe(a, 2));
    }
  EXPECT_EQ(forwards, (std::vector<std::string>{"F c0 m0", "F c0 m1", "F c1 m0", "F c1 m1", "F c0 m2", "F c0 m3",
                                                "F c1 m2", "F c1 m3"}));
  EXPECT_EQ(backwards, (std::vector<std::string>{"B c1 m0", "B c1 m1", "B c0 m0", "B c0 m1", "B c1 m2", "B c1 m3",
                                                 "B c0 m2", "B c0 m3"}));
  // The first backward comes after the 4 warm-up forwards and the 5th forward.
  const std::string d = describe(s, 0);
  EXPECT_LT(d.find("F c0 m2"), d.find("B c1 m0")) << d;
  EXPECT_LT(d.find("B c1 m0"), d.find("F c0 m3")) << d;
}

TEST(PipelineSchedule, UsageErrorsNameTheFlags) {
  std::string e = error_of(1, 2, 4);
  EXPECT_NE(e.find("--num-layers-per-virtual-pipeline-stage"), std::string::npos) << e;
  EXPECT_NE(e.find("--pipeline-model-parallel-size"), std::string::npos) << e;
  e = error_of(4, 2, 6);
  EXPECT_NE(e.find("number of micro-batches (6) to be a multiple of --pipeline-model-parallel-size (4)"),
            std::string::npos)
      << e;
  EXPECT_NE(e.find("--global-batch-size"), std::string::npos) << e;
  EXPECT_NE(e.find("--micro-batch-size"), std::string::npos) << e;
  e = error_of(4, 1, 0);
  EXPECT_NE(e.find("at least one micro-batch"), std::string::npos) << e;
  EXPECT_NE(error_of(0, 1, 4).find("--pipeline-model-parallel-size must be at least 1"), std::string::npos);
  EXPECT_NE(error_of(2, 0, 4).find("virtual pipeline stages"), std::string::npos);
  EXPECT_EQ(error_of(4, 1, 6), "(no error)");  // 1F1B takes any number of micro-batches
}

// The simulator itself: schedules broken on purpose must fail it.
TEST(PipelineSchedule, SimulatorCatchesBrokenSchedules) {
  using P = PipeOp;
  std::vector<std::vector<int>> peak;
  // Both ranks send before they receive, outside a batch: each waits for the other.
  PipelineSchedule both_send_first{2, 1, 2, {}};
  both_send_first.ranks = {
      {{{{P::Forward, 0, 0, -1}}}, {{{P::SendForward, 0, 0, 1}}}, {{{P::Forward, 0, 1, -1}}},
       {{{P::SendForward, 0, 1, 1}}}, {{{P::RecvBackward, 0, 0, 1}}}, {{{P::Backward, 0, 0, -1}}},
       {{{P::RecvBackward, 0, 1, 1}}}, {{{P::Backward, 0, 1, -1}}}},
      {{{{P::RecvForward, 0, 0, 0}}}, {{{P::Forward, 0, 0, -1}}}, {{{P::Backward, 0, 0, -1}}},
       {{{P::SendBackward, 0, 0, 0}}}, {{{P::RecvForward, 0, 1, 0}}}, {{{P::Forward, 0, 1, -1}}},
       {{{P::Backward, 0, 1, -1}}}, {{{P::SendBackward, 0, 1, 0}}}}};
  EXPECT_NE(simulate(both_send_first, peak).find("deadlock"), std::string::npos);
  // Posting them together instead is fine.
  PipelineSchedule batched = both_send_first;
  batched.ranks[0].erase(batched.ranks[0].begin() + 4);  // recv_bwd m0 moves into send_fwd m1's batch
  batched.ranks[0][3].actions.push_back({P::RecvBackward, 0, 0, 1});
  EXPECT_EQ(simulate(batched, peak), "");

  // Megatron's batch order (send to prev first) puts a gradient where pp 2's peer expects an
  // activation under one FIFO per pair.
  PipelineSchedule s = make_pipeline_schedule(2, 2, 4);
  bool swapped = false;
  for (PipeStep& step : s.ranks[0]) {
    auto& a = step.actions;
    auto sf = std::find_if(a.begin(), a.end(), [](const PipeAction& x) { return x.op == P::SendForward; });
    auto sb = std::find_if(a.begin(), a.end(), [](const PipeAction& x) { return x.op == P::SendBackward; });
    if (!swapped && sf != a.end() && sb != a.end()) std::iter_swap(sf, sb), swapped = true;
  }
  ASSERT_TRUE(swapped);
  EXPECT_NE(simulate(s, peak).find("meets"), std::string::npos) << simulate(s, peak);

  // A lost receive.
  PipelineSchedule lost = make_pipeline_schedule(2, 1, 1);
  lost.ranks[1].erase(lost.ranks[1].begin());  // recv_fwd m0
  EXPECT_NE(simulate(lost, peak).find("no recv for rank 0"), std::string::npos) << simulate(lost, peak);
}
