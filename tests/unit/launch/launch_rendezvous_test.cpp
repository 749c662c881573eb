// The launchers' agreement protocol (launch/rendezvous.h) over the in-process store: nodes
// joining from threads, a join timeout that names the missing node, duplicate node ranks,
// differing settings, stop notices and the decision every node takes after an attempt.
#include <gtest/gtest.h>

#include <chrono>
#include <future>
#include <string>
#include <thread>

#include "tessera/comm/store.h"
#include "tessera/core/error.h"
#include "tessera/launch/rendezvous.h"

namespace tessera::launch {
namespace {

using std::chrono::milliseconds;

RendezvousConfig config(int node_rank, int nnodes, bool is_host) {
  RendezvousConfig c;
  c.nnodes = nnodes;
  c.node_rank = node_rank;
  c.is_host = is_host;
  c.host = "host" + std::to_string(node_rank);
  c.nproc = node_rank + 1;  // heterogeneous on purpose
  c.store_address = "10.0.0.1:29500";
  c.config = "nnodes=" + std::to_string(nnodes) + " max_restarts=1 run_id=t";
  c.join_timeout = milliseconds(5000);
  c.keep_alive_interval = milliseconds(50);
  c.keep_alive_max_attempt = 3;
  return c;
}

auto always = [] { return true; };

TEST(LaunchRendezvous, ThreeNodesJoinInAnyOrder) {
  auto store = make_local_store(milliseconds(5000));
  std::vector<std::future<std::vector<NodeInfo>>> joins;
  for (int r : {2, 1, 0}) {
    joins.push_back(std::async(std::launch::async, [&store, r] {
      NodeRendezvous rdzv(*store, config(r, 3, r == 0));
      return *rdzv.join(always);
    }));
  }
  for (auto& j : joins) {
    auto nodes = j.get();
    ASSERT_EQ(nodes.size(), 3u);
    for (int r = 0; r < 3; ++r) {
      EXPECT_EQ(nodes[r].node_rank, r);
      EXPECT_EQ(nodes[r].host, "host" + std::to_string(r));
      EXPECT_EQ(nodes[r].nproc, r + 1);
    }
  }
}

TEST(LaunchRendezvous, DynamicRanksGiveTheHostZero) {
  auto store = make_local_store(milliseconds(5000));
  auto other = std::async(std::launch::async, [&] {
    NodeRendezvous r(*store, config(-1, 2, false));
    r.join(always);
    return r.node_rank();
  });
  NodeRendezvous host(*store, config(-1, 2, true));
  host.join(always);
  EXPECT_EQ(host.node_rank(), 0);
  EXPECT_EQ(other.get(), 1);
}

TEST(LaunchRendezvous, JoinTimeoutNamesTheMissingNodeAndTheAddress) {
  auto store = make_local_store(milliseconds(5000));
  RendezvousConfig c = config(0, 2, true);
  c.join_timeout = milliseconds(300);
  c.rejoin_hint = "--node_rank <missing rank>";
  NodeRendezvous rdzv(*store, c);
  auto start = std::chrono::steady_clock::now();
  try {
    rdzv.join(always);
    FAIL() << "expected a timeout";
  } catch (const Error& e) {
    std::string what = e.what();
    EXPECT_NE(what.find("10.0.0.1:29500"), std::string::npos) << what;
    EXPECT_NE(what.find("1 of 2 nodes joined (node 0 on host0)"), std::string::npos) << what;
    EXPECT_NE(what.find("node rank(s) 1"), std::string::npos) << what;
    EXPECT_NE(e.hint().find("firewall"), std::string::npos) << e.hint();
    EXPECT_NE(e.hint().find("--node_rank <missing rank>"), std::string::npos) << e.hint();
  }
  // The timeout is kept to within the 100 ms polling step (plus scheduling slack).
  EXPECT_LT(std::chrono::steady_clock::now() - start, milliseconds(2000));
}

TEST(LaunchRendezvous, InterruptedJoinReturnsNothing) {
  auto store = make_local_store(milliseconds(5000));
  NodeRendezvous rdzv(*store, config(0, 2, true));
  EXPECT_FALSE(rdzv.join([] { return false; }).has_value());
}

TEST(LaunchRendezvous, DuplicateNodeRankAndDifferentSettingsAreErrors) {
  auto store = make_local_store(milliseconds(5000));
  RendezvousConfig c0 = config(0, 2, true);
  c0.join_timeout = milliseconds(200);
  NodeRendezvous host(*store, c0);
  EXPECT_THROW(host.join(always), Error);  // times out, but node 0 is registered

  RendezvousConfig dup = config(0, 2, false);
  NodeRendezvous second(*store, dup);
  try {
    second.join(always);
    FAIL() << "expected a duplicate-rank error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("node rank 0 was already taken (by host0)"), std::string::npos) << e.what();
  }
  RendezvousConfig other = config(1, 2, false);
  other.config = "nnodes=2 max_restarts=0 run_id=t";
  NodeRendezvous mismatch(*store, other);
  try {
    mismatch.join(always);
    FAIL() << "expected a settings error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("max_restarts=0"), std::string::npos) << e.what();
  }
}

TEST(LaunchRendezvous, StopNoticesAndDecisions) {
  auto store = make_local_store(milliseconds(5000));
  auto node1 = std::async(std::launch::async, [&] {
    auto r = std::make_unique<NodeRendezvous>(*store, config(1, 2, false));
    r->join(always);
    return r;
  });
  NodeRendezvous n0(*store, config(0, 2, true));
  n0.join(always);
  auto n1 = node1.get();

  // Attempt 0: node 1's rank 2 fails; node 0 learns it; both end; both decide to restart.
  EXPECT_FALSE(n0.stop_notice(0).has_value());
  StopRecord failure;
  failure.exit_code = 7;
  failure.summary = "rank 2 (local rank 0) on node 1 (host1) exited with code 7";
  failure.tail = {"line a", "line b"};
  n1->publish_stop(0, failure);
  auto seen = n0.stop_notice(0);
  ASSERT_TRUE(seen.has_value());
  EXPECT_EQ(seen->summary, failure.summary);
  EXPECT_EQ(seen->exit_code, 7);
  EXPECT_EQ(seen->tail, failure.tail);
  EXPECT_FALSE(seen->shutdown);
  // A second report of the same attempt does not replace the first.
  StopRecord later;
  later.summary = "later";
  n0.publish_stop(0, later);
  EXPECT_EQ(n1->stop_notice(0)->summary, failure.summary);

  n1->end_attempt(0, "failed");
  EXPECT_FALSE(n0.all_ended(0));
  n0.end_attempt(0, "stopped");
  EXPECT_TRUE(n0.all_ended(0));
  EXPECT_EQ(n0.decide(0, 1).kind, Decision::Restart);
  EXPECT_EQ(n1->decide(0, 1).kind, Decision::Restart);

  // Attempt 1: the same failure again is final.
  n1->publish_stop(1, failure);
  EXPECT_EQ(n0.decide(1, 1).kind, Decision::Fail);
  EXPECT_EQ(n0.decide(1, 1).record.exit_code, 7);

  // Attempt 2 runs clean: success.
  EXPECT_EQ(n0.decide(2, 5).kind, Decision::Success);

  // A shutdown (a signal on some node) wins over everything and is never restarted.
  StopRecord shutdown;
  shutdown.shutdown = true;
  shutdown.exit_code = 143;
  shutdown.summary = "node 1 (host1): tessera launch received SIGTERM";
  n1->publish_stop(3, shutdown);
  EXPECT_TRUE(n0.stop_notice(3)->shutdown);
  Decision d = n0.decide(3, 100);
  EXPECT_EQ(d.kind, Decision::Shutdown);
  EXPECT_EQ(d.record.exit_code, 143);
}

TEST(LaunchRendezvous, SilentNodeIsReportedLost) {
  // A beat every 500 ms, lost after 1.5 s of silence: far above any scheduling delay of a
  // loaded machine, so only the real silence below can look like a lost node.
  auto beating = [](int node_rank, bool is_host) {
    RendezvousConfig c = config(node_rank, 2, is_host);
    c.keep_alive_interval = milliseconds(500);
    return c;
  };
  auto store = make_local_store(milliseconds(5000));
  auto node1 = std::async(std::launch::async, [&] {
    auto r = std::make_unique<NodeRendezvous>(*store, beating(1, false));
    r->join(always);
    return r;
  });
  NodeRendezvous n0(*store, beating(0, true));
  n0.join(always);
  auto n1 = node1.get();
  // Both beat for a while: nobody is lost.
  for (int i = 0; i < 10; ++i) {
    EXPECT_FALSE(n0.heartbeat().has_value());
    EXPECT_FALSE(n1->heartbeat().has_value());
    std::this_thread::sleep_for(milliseconds(30));
  }
  // Node 1 goes silent: after 3 x 500 ms node 0 says so (30 s only guards against a hang).
  std::optional<NodeInfo> lost;
  auto start = std::chrono::steady_clock::now();
  while (!lost && std::chrono::steady_clock::now() - start < milliseconds(30000)) {
    lost = n0.heartbeat();
    std::this_thread::sleep_for(milliseconds(10));
  }
  ASSERT_TRUE(lost.has_value());
  EXPECT_EQ(lost->node_rank, 1);
  EXPECT_EQ(lost->host, "host1");
}

TEST(LaunchRendezvous, StopRecordRoundTrip) {
  StopRecord r;
  r.shutdown = true;
  r.exit_code = 137;
  r.summary = "s";
  r.tail = {"", "x y", "z"};
  StopRecord back = StopRecord::decode([&] {
    std::string e = r.encode();
    return std::vector<uint8_t>(e.begin(), e.end());
  }());
  EXPECT_TRUE(back.shutdown);
  EXPECT_EQ(back.exit_code, 137);
  EXPECT_EQ(back.summary, "s");
  EXPECT_EQ(back.tail, r.tail);
}

}  // namespace
}  // namespace tessera::launch
