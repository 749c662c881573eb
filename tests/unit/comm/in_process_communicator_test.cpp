// The in-process backend (ranks as threads): every collective against values computed here,
// reductions in rank order (bit-exact even when float sums are not associative), async calls,
// split, and the errors a parallel-logic bug should produce: a rank that never arrives (named,
// within the timeout), mismatched collectives, a send nobody receives. Asynchronous p2p:
// batched exchanges in both directions, many outstanding messages per pair in order, waits
// bounded by the timeout.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <thread>

#include "tessera/comm/all_to_all.h"
#include "tessera/comm/in_process/in_process_communicator.h"
#include "tessera/comm/ordered_sum.h"
#include "tessera/core/error.h"

using namespace tessera;
using namespace std::chrono_literals;

namespace {

Tensor f32(std::vector<float>& v) { return Tensor(v.data(), DType::F32, {static_cast<int64_t>(v.size())}, nullptr); }
Tensor i32(std::vector<int32_t>& v) {
  return Tensor(v.data(), DType::I32, {static_cast<int64_t>(v.size())}, nullptr);
}
Tensor i64(std::vector<int64_t>& v) {
  return Tensor(v.data(), DType::I64, {static_cast<int64_t>(v.size())}, nullptr);
}

template <typename F>
std::string error_of(F f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

}  // namespace

TEST(InProcessComm, AllReduceSumAndMaxForEveryDtype) {
  static constexpr int N = 4, K = 1001;
  run_in_process_ranks(N, [](Communicator& c) {
    const int r = c.rank();
    EXPECT_EQ(c.size(), N);
    EXPECT_EQ(c.backend_name(), "in-process");
    EXPECT_EQ(c.group_name(), "world");
    std::vector<float> f(K);
    std::vector<int32_t> i(K);
    std::vector<int64_t> l(K);
    for (int k = 0; k < K; ++k) f[k] = float((r + 1) * (k % 7 + 1)), i[k] = (r + 1) * k, l[k] = int64_t(r) << 40;
    c.all_reduce(f32(f), ReduceOp::Sum);
    c.all_reduce(i32(i), ReduceOp::Sum);
    c.all_reduce(i64(l), ReduceOp::Max);
    for (int k = 0; k < K; ++k) {
      ASSERT_EQ(f[k], float(10 * (k % 7 + 1)));  // 1+2+3+4 = 10
      ASSERT_EQ(i[k], 10 * k);
      ASSERT_EQ(l[k], int64_t(N - 1) << 40);
    }
    std::vector<float> m = {float(r), float(-r), r == 2 ? 100.f : 0.f};
    c.all_reduce(f32(m), ReduceOp::Max);
    EXPECT_EQ(m, (std::vector<float>{3.f, 0.f, 100.f}));
  });
}

TEST(InProcessComm, SumsInRankOrderBitForBit) {
  // Values whose float sum depends on the order: the result must be ((r0 + r1) + r2) + r3.
  const float v[4] = {1e8f, 1.f, -1e8f, 0.5f};
  const float expected = ((v[0] + v[1]) + v[2]) + v[3];
  run_in_process_ranks(4, [&](Communicator& c) {
    std::vector<float> x(3, v[c.rank()]);
    c.all_reduce(f32(x), ReduceOp::Sum);
    for (float y : x) EXPECT_EQ(std::memcmp(&y, &expected, 4), 0) << y << " vs " << expected;
  });
}

TEST(InProcessComm, AllGatherReduceScatterBroadcast) {
  static constexpr int N = 3, K = 5;
  run_in_process_ranks(N, [](Communicator& c) {
    const int r = c.rank();
    std::vector<float> in(K), out(N * K);
    for (int k = 0; k < K; ++k) in[k] = float(100 * r + k);
    c.all_gather(f32(out), f32(in));
    for (int q = 0; q < N; ++q)
      for (int k = 0; k < K; ++k) ASSERT_EQ(out[q * K + k], float(100 * q + k));

    // reduce_scatter: chunk q of the sum goes to rank q.
    std::vector<int64_t> big(N * K), mine(K);
    for (int j = 0; j < N * K; ++j) big[j] = (r + 1) * j;
    c.reduce_scatter(i64(mine), i64(big), ReduceOp::Sum);
    for (int k = 0; k < K; ++k) ASSERT_EQ(mine[k], 6 * (r * K + k));  // 1+2+3 = 6

    // broadcast from rank 1, any dtype (bf16 patterns as raw 16-bit values).
    std::vector<uint16_t> b(K, uint16_t(r == 1 ? 0xBEEF : 0));
    c.broadcast(Tensor(b.data(), DType::BF16, {K}, nullptr), 1);
    for (auto x : b) ASSERT_EQ(x, 0xBEEF);
    c.barrier();
  });
}

TEST(InProcessComm, SendRecvArriveInOrder) {
  run_in_process_ranks(3, [](Communicator& c) {
    const int r = c.rank(), n = c.size();
    const int next = (r + 1) % n, prev = (r + n - 1) % n;
    for (int msg = 0; msg < 3; ++msg) {
      std::vector<int32_t> out(4, r * 10 + msg), in(4, -1);
      // even ranks send first, odd ranks receive first: no two neighbours both send first
      if (r % 2 == 0) {
        c.send(i32(out), next);
        c.recv(i32(in), prev);
      } else {
        c.recv(i32(in), prev);
        c.send(i32(out), next);
      }
      for (int x : in) ASSERT_EQ(x, prev * 10 + msg);
    }
  });
}

TEST(InProcessComm, AsyncAllReducesCompleteInOrderBeforeLaterCalls) {
  run_in_process_ranks(4, [](Communicator& c) {
    std::vector<std::vector<float>> bufs(5, std::vector<float>(64, float(c.rank() + 1)));
    std::vector<std::unique_ptr<Work>> works;
    for (auto& b : bufs) works.push_back(c.all_reduce_async(f32(b), ReduceOp::Sum));
    std::vector<float> sync(8, 1.f);
    c.all_reduce(f32(sync), ReduceOp::Sum);  // waits for the async ones first
    for (auto& w : works) w->wait();
    for (auto& b : bufs)
      for (float x : b) ASSERT_EQ(x, 10.f);
    for (float x : sync) ASSERT_EQ(x, 4.f);
  });
}

TEST(InProcessComm, SplitGivesEachRankItsSubgroup) {
  run_in_process_ranks(4, [](Communicator& c) {
    const int r = c.rank();
    auto sub = c.split({{0, 2}, {3, 1}}, "pairs");
    ASSERT_TRUE(sub);
    EXPECT_EQ(sub->group_name(), "pairs");
    EXPECT_EQ(sub->size(), 2);
    const std::vector<int> expected_ranks = (r % 2 == 0) ? std::vector<int>{0, 2} : std::vector<int>{3, 1};
    EXPECT_EQ(sub->world_ranks(), expected_ranks);
    EXPECT_EQ(sub->rank(), r == 0 || r == 3 ? 0 : 1);
    std::vector<float> x(2, float(r));
    sub->all_reduce(f32(x), ReduceOp::Sum);
    EXPECT_EQ(x[0], r % 2 == 0 ? 2.f : 4.f);

    // A split of a split; rank 3 is in no group and gets none.
    auto only_first = sub->split({{0}}, "first");
    EXPECT_EQ(only_first != nullptr, sub->rank() == 0);
    if (only_first) {
      EXPECT_EQ(only_first->world_ranks(), std::vector<int>{expected_ranks[0]});
    }
    auto none = c.split({{0, 1, 2}});
    EXPECT_EQ(none != nullptr, r != 3);
    if (none) {
      EXPECT_EQ(none->group_name(), "world/split1");
    }
  });
}

TEST(InProcessComm, TimeoutNamesTheRankThatDidNotArrive) {
  std::vector<std::string> errors(3);
  auto t0 = std::chrono::steady_clock::now();
  run_in_process_ranks(
      3,
      [&](Communicator& c) {
        if (c.rank() == 2) return;  // never calls
        std::vector<float> x(4, 1.f);
        errors[c.rank()] = error_of([&] { c.all_reduce(f32(x), ReduceOp::Sum); });
      },
      300ms);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 5s);
  for (int r = 0; r < 2; ++r) {
    // one rank times out and names rank 2; the other sees the group broken by that timeout
    EXPECT_NE(errors[r].find("all_reduce(sum) of 4 f32"), std::string::npos) << errors[r];
    EXPECT_NE(errors[r].find("group 'world'"), std::string::npos) << errors[r];
  }
  const std::string& named = errors[0].find("had not called") != std::string::npos ? errors[0] : errors[1];
  EXPECT_NE(named.find("timed out after 0.3 s: world rank(s) 2 had not called it"), std::string::npos) << named;
}

TEST(InProcessComm, MismatchedCollectivesAreNamed) {
  std::vector<std::string> errors(2);
  run_in_process_ranks(
      2,
      [&](Communicator& c) {
        std::vector<float> x(4, 1.f);
        errors[c.rank()] = error_of([&] {
          if (c.rank() == 0) c.broadcast(f32(x), 0);
          else c.all_reduce(f32(x), ReduceOp::Sum);
        });
      },
      2s);
  const std::string all = errors[0] + "\n" + errors[1];
  EXPECT_NE(all.find("collective mismatch"), std::string::npos) << all;
  EXPECT_NE(all.find("broadcast(root 0) of 4 f32"), std::string::npos) << all;
  EXPECT_NE(all.find("all_reduce(sum) of 4 f32"), std::string::npos) << all;
}

TEST(InProcessComm, SendWithoutRecvTimesOut) {
  std::string error;
  run_in_process_ranks(
      2,
      [&](Communicator& c) {
        if (c.rank() == 1) return;
        std::vector<float> x(4, 1.f);
        error = error_of([&] { c.send(f32(x), 1); });
      },
      200ms);
  EXPECT_NE(error.find("send of 4 f32 to world rank 1"), std::string::npos) << error;
  EXPECT_NE(error.find("did not post the matching recv"), std::string::npos) << error;
}

// Megatron's batch_isend_irecv: both ranks post a send to and a recv from each other, then
// wait; blocking sends would deadlock here, posted ones must not.
TEST(InProcessComm, BatchedExchangeInBothDirectionsDoesNotDeadlock) {
  run_in_process_ranks(
      4,
      [](Communicator& c) {
        const int r = c.rank(), n = c.size();
        const int next = (r + 1) % n, prev = (r + n - 1) % n;
        for (int round = 0; round < 10; ++round) {
          std::vector<int32_t> to_next(64, r * 100 + round), to_prev(64, -r * 100 - round);
          std::vector<int32_t> from_prev(64, 0), from_next(64, 0);
          std::vector<std::unique_ptr<Work>> batch;
          batch.push_back(c.send_async(i32(to_next), next));
          batch.push_back(c.recv_async(i32(from_prev), prev));
          batch.push_back(c.send_async(i32(to_prev), prev));
          batch.push_back(c.recv_async(i32(from_next), next));
          for (auto& w : batch) w->wait();
          for (int k = 0; k < 64; ++k) {
            ASSERT_EQ(from_prev[k], prev * 100 + round);
            ASSERT_EQ(from_next[k], -next * 100 - round);
          }
        }
      },
      5s);
}

// Every rank posts, to and from every other rank, messages of different sizes, sends and
// recvs interleaved differently on each rank, all outstanding before any wait; the k-th
// send of each pair must fill the k-th recv. Blocking calls count in the same sequence.
TEST(InProcessComm, ManyOutstandingMessagesPerPairArriveInOrder) {
  static constexpr int N = 3, M = 40;
  run_in_process_ranks(
      N,
      [](Communicator& c) {
        const int r = c.rank();
        auto value = [](int src, int dst, int k, int i) { return src * 1000000 + dst * 100000 + k * 100 + i % 97; };
        std::vector<std::vector<std::vector<int32_t>>> out(N), in(N);
        for (int q = 0; q < N; ++q)
          for (int k = 0; k < M && q != r; ++k) {
            auto& o = out[q].emplace_back(k % 5 + 1);
            for (size_t i = 0; i < o.size(); ++i) o[i] = value(r, q, k, int(i));
            in[q].emplace_back(k % 5 + 1, -1);
          }
        std::vector<std::unique_ptr<Work>> works;
        for (int q = 0; q < N; ++q) {
          if (q == r) continue;
          if (r % 2 == 0) {  // send k, recv k, send k+1, ...
            for (int k = 0; k < M; ++k) {
              works.push_back(c.send_async(i32(out[q][k]), q));
              works.push_back(c.recv_async(i32(in[q][k]), q));
            }
          } else {  // every recv, then every send
            for (int k = 0; k < M; ++k) works.push_back(c.recv_async(i32(in[q][k]), q));
            for (int k = 0; k < M; ++k) works.push_back(c.send_async(i32(out[q][k]), q));
          }
        }
        for (auto it = works.rbegin(); it != works.rend(); ++it) (*it)->wait();  // newest first
        for (int q = 0; q < N; ++q) {
          if (q == r) continue;
          for (int k = 0; k < M; ++k)
            for (size_t i = 0; i < in[q][k].size(); ++i) ASSERT_EQ(in[q][k][i], value(q, r, k, int(i)));
        }
        // A blocking exchange after the async ones continues the same per-pair sequence.
        std::vector<int32_t> x(3, r), y(3, -1);
        const int peer = r ^ 1;
        if (peer < N) {
          if (r % 2 == 0) {
            c.send(i32(x), peer);
            c.recv(i32(y), peer);
          } else {
            c.recv(i32(y), peer);
            c.send(i32(x), peer);
          }
          EXPECT_EQ(y, std::vector<int32_t>(3, peer));
        }
      },
      10s);
}

TEST(InProcessComm, AsyncWaitIsBoundedAndNamesThePeer) {
  std::vector<std::string> errors(2);
  auto t0 = std::chrono::steady_clock::now();
  run_in_process_ranks(
      2,
      [&](Communicator& c) {
        if (c.rank() == 1) return;  // never posts
        std::vector<float> x(4, 1.f), y(4);
        auto s = c.send_async(f32(x), 1);
        auto r = c.recv_async(f32(y), 1);
        errors[0] = error_of([&] { s->wait(); });
        errors[1] = error_of([&] { r->wait(); });
        s->wait();  // a second wait does nothing
      },
      200ms);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 3s);
  EXPECT_NE(errors[0].find("send_async of 4 f32 to world rank 1 (message 1 from world rank 0 to world rank 1 on "
                           "group 'world' (world ranks 0, 1), this is world rank 0) timed out after 0.2 s: world "
                           "rank 1 did not post the matching recv in time"),
            std::string::npos)
      << errors[0];
  EXPECT_NE(errors[1].find("recv_async of 4 f32 from world rank 1 (message 1 from world rank 1 to world rank 0"),
            std::string::npos)
      << errors[1];
  EXPECT_NE(errors[1].find("did not post the matching send"), std::string::npos) << errors[1];
}

// A Work dropped without wait() still completes (its destructor waits), so the peer's
// matching call finds live memory and the pair's sequence stays aligned.
TEST(InProcessComm, UnwaitedWorkCompletesInItsDestructor) {
  run_in_process_ranks(
      2,
      [](Communicator& c) {
        std::vector<int32_t> a(8, 7), b(8, 0);
        if (c.rank() == 0) {
          c.send_async(i32(a), 1);  // dropped at once
          c.send(i32(a), 1);
        } else {
          c.recv(i32(b), 0);
          EXPECT_EQ(b, a);
          std::fill(b.begin(), b.end(), 0);
          c.recv(i32(b), 0);
          EXPECT_EQ(b, a);
        }
      },
      5s);
}

// all_to_all_v (comm/all_to_all.h): rank r sends (r + j) % 3 rows to rank j, row values naming
// sender, receiver and row; every rank receives its runs in sender order, empty runs included.
TEST(InProcessComm, AllToAllVMovesRunsOfRows) {
  static constexpr int N = 3, C = 2;
  auto rows = [](int from, int to) { return int64_t((from + to) % 3); };
  run_in_process_ranks(N, [&](Communicator& c) {
    const int r = c.rank();
    std::vector<int64_t> send(N), recv(N);
    std::vector<float> in, out;
    for (int j = 0; j < N; ++j) {
      send[j] = rows(r, j);
      recv[j] = rows(j, r);
      for (int64_t i = 0; i < send[j]; ++i)
        for (int k = 0; k < C; ++k) in.push_back(float(100 * r + 10 * j + i));
    }
    int64_t total = 0;
    for (int64_t n : recv) total += n;
    out.assign(static_cast<size_t>(total * C), -1.0f);
    all_to_all_v(c, Tensor(out.data(), DType::F32, {total, C}, nullptr), recv,
                 Tensor(in.data(), DType::F32, {int64_t(in.size() / C), C}, nullptr), send);
    size_t at = 0;
    for (int from = 0; from < N; ++from)
      for (int64_t i = 0; i < rows(from, r); ++i)
        for (int k = 0; k < C; ++k) EXPECT_EQ(out[at++], float(100 * from + 10 * r + i)) << from << " " << i;
  });
}

// The canonical order of comm/ordered_sum.h: halves split at the largest power of two, so
// aligned blocks of 2 (and 4) consecutive pieces are subtrees (what expert parallelism relies on).
TEST(OrderedSum, CanonicalStepsAreTheBinaryTree) {
  using Steps = std::vector<std::pair<int, int>>;
  EXPECT_EQ(canonical_sum_steps(1), Steps{});
  EXPECT_EQ(canonical_sum_steps(2), (Steps{{0, 1}}));
  EXPECT_EQ(canonical_sum_steps(3), (Steps{{0, 1}, {0, 2}}));
  EXPECT_EQ(canonical_sum_steps(4), (Steps{{0, 1}, {2, 3}, {0, 2}}));
  EXPECT_EQ(canonical_sum_steps(6), (Steps{{0, 1}, {2, 3}, {0, 2}, {4, 5}, {0, 4}}));
  EXPECT_EQ(canonical_sum_steps(8), (Steps{{0, 1}, {2, 3}, {0, 2}, {4, 5}, {6, 7}, {4, 6}, {0, 4}}));
}

// The streaming form (pieces one at a time, few alive) adds as the tree does, bit for bit, and
// never uses more than slots_for(n) slots. 1e8 then 3s: left to right every 3 vanishes (f32
// spacing 8), the tree adds the 3s in subtrees first (1e8 + 8 from n = 4 on).
TEST(OrderedSum, StackAddsAsTheTreeDoes) {
  for (int n = 1; n <= 17; ++n) {
    std::vector<float> x(n);
    for (int i = 0; i < n; ++i) x[i] = i == 0 ? 1e8f : 3.f;  // left to right: 1e8 for every n
    std::vector<float> tree = x;
    for (const auto& [into, from] : canonical_sum_steps(n)) tree[into] += tree[from];
    CanonicalSumStack stack;
    std::vector<float> slots(CanonicalSumStack::slots_for(n), NAN);
    for (int i = 0; i < n; ++i) {
      ASSERT_LT(stack.next_slot(), CanonicalSumStack::slots_for(n)) << n;
      slots[stack.next_slot()] = x[i];
      for (const auto& [into, from] : stack.push()) slots[into] += slots[from];
    }
    for (const auto& [into, from] : stack.finish()) slots[into] += slots[from];
    EXPECT_EQ(std::memcmp(&slots[0], &tree[0], 4), 0) << n << ": " << slots[0] << " vs " << tree[0];
  }
  EXPECT_EQ(CanonicalSumStack::slots_for(1), 1);
  EXPECT_EQ(CanonicalSumStack::slots_for(2), 2);
  EXPECT_EQ(CanonicalSumStack::slots_for(4), 3);
  EXPECT_EQ(CanonicalSumStack::slots_for(7), 3);
}

// In-process ranks add in rank order, ((x0 + x1) + x2) + x3 = 2e8 here; the canonical order
// gives (x0 + x1) + (x2 + x3) = 2e8 + 16 (f32 spacing 16 at 2e8). Three ranks: (x0 + x1) + x2
// = (1e8 + 4) + 4 = 1e8 (ties to even at spacing 8), where a ring starting at rank 1 gives
// (4 + 4) + 1e8 = 1e8 + 8.
TEST(OrderedSum, AllReduceAndReduceScatterAddInTheCanonicalOrder) {
  const float v[4] = {1e8f, 1e8f, 3.f, 7.f};
  run_in_process_ranks(4, [&](Communicator& c) {
    std::vector<float> plain(7, v[c.rank()]), ordered(7, v[c.rank()]), big(8, v[c.rank()]), chunk(2, -1.f);
    c.all_reduce(f32(plain), ReduceOp::Sum);
    ordered_all_reduce_sum(c, f32(ordered));
    ordered_reduce_scatter_sum(c, f32(chunk), f32(big));
    EXPECT_EQ(plain, std::vector<float>(7, 2e8f));
    EXPECT_EQ(ordered, std::vector<float>(7, 2e8f + 16.f));
    EXPECT_EQ(chunk, std::vector<float>(2, 2e8f + 16.f));
  });
  run_in_process_ranks(3, [&](Communicator& c) {
    std::vector<float> x(5, c.rank() == 0 ? 1e8f : 4.f);
    ordered_all_reduce_sum(c, f32(x));
    EXPECT_EQ(x, std::vector<float>(5, 1e8f));
  });
  run_in_process_ranks(1, [&](Communicator& c) {  // a group of one: a copy
    std::vector<float> x = {1.f, 2.f}, chunk(2, -1.f);
    ordered_all_reduce_sum(c, f32(x));
    ordered_reduce_scatter_sum(c, f32(chunk), f32(x));
    EXPECT_EQ(chunk, x);
  });
}
