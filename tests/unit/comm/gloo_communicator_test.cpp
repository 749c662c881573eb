// The Gloo backend with real processes on loopback (forked by run_local_ranks, each with
// torchrun-style variables and the parent's store): every collective bit-exact against
// exact-sum inputs (small integers in floats, so any summation order gives the same bits),
// subgroups from Topology, async all-reduce, async p2p (order per pair, bounded waits), the
// timeout error naming the rank that did not call, and the interface choice (GLOO_SOCKET_IFNAME errors list the interfaces; the route
// rule finds loopback or this host's own interface). Each multi-process case is bounded by
// run_local_ranks' timeout (<= 30 s) and takes a few seconds.
#include <gtest/gtest.h>

#include <array>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <thread>

#include "tessera/comm/backend.h"
#include "tessera/comm/gloo/gloo_communicator.h"
#include "tessera/comm/local_ranks.h"
#include "tessera/comm/net_interface.h"
#include "tessera/comm/ordered_sum.h"
#include "tessera/core/error.h"
#include "tessera/device/cpu/cpu_device.h"
#include "tessera/device/device.h"
#include "tessera/device/registry.h"
#include "tessera/parallel/topology.h"

using namespace tessera;
using namespace std::chrono_literals;

namespace {

// Inside a child: a failed check throws, the child prints it and exits 1.
#define CHILD_CHECK(cond, what)                                                                   \
  do {                                                                                            \
    if (!(cond)) throw std::runtime_error(std::string("check failed: " #cond ": ") + (what));     \
  } while (0)

std::shared_ptr<Store> g_store;  // per child process

std::unique_ptr<Communicator> world_from_env(std::chrono::milliseconds timeout) {
  const int rank = std::atoi(std::getenv("RANK"));
  const int size = std::atoi(std::getenv("WORLD_SIZE"));
  const std::string host = std::getenv("MASTER_ADDR");
  const int port = std::atoi(std::getenv("MASTER_PORT"));
  g_store = std::shared_ptr<Store>(connect_tcp_store(host, port, std::getenv("TESSERA_JOB_TOKEN"), timeout));
  GlooOptions o;
  o.timeout = timeout;
  o.master_addr = host;
  o.master_port = port;
  o.key_prefix = "test/";
  return create_gloo_communicator(g_store, rank, size, o);
}

void run_ranks(int n, const std::function<int(int)>& body, std::chrono::seconds limit = 30s) {
  LocalRanksOptions o;
  o.world_size = n;
  o.timeout = limit;
  auto results = run_local_ranks(o, body);
  EXPECT_EQ(describe_failures(results), "");
}

template <typename T>
Tensor tensor(std::vector<T>& v, DType t) {
  return Tensor(v.data(), t, {static_cast<int64_t>(v.size())}, nullptr);
}

template <typename F>
std::string error_of(F f) {
  try {
    f();
  } catch (const Error& e) {
    return std::string(e.what()) + "\nhint: " + e.hint();
  }
  return "(no error)";
}

}  // namespace

TEST(GlooComm, EveryCollectiveIsBitExactAcrossProcesses) {
  constexpr int N = 3;
  run_ranks(N, [](int) {
    auto c = world_from_env(20s);
    const int r = c->rank();
    CHILD_CHECK(c->size() == N && c->backend_name() == "gloo", "world");
    const int tri = N * (N + 1) / 2;
    // all_reduce: f32 across several segment sizes (odd, and > Gloo's 1 MiB segments), i32, i64.
    for (int64_t k : {int64_t(1), int64_t(10007), int64_t(600000)}) {
      std::vector<float> f(k);
      for (int64_t i = 0; i < k; ++i) f[i] = float((r + 1) * (i % 7 + 1));
      c->all_reduce(tensor(f, DType::F32), ReduceOp::Sum);
      for (int64_t i = 0; i < k; ++i) {
        const float want = float(tri * (i % 7 + 1));
        CHILD_CHECK(std::memcmp(&f[i], &want, 4) == 0, "f32 sum at " + std::to_string(i));
      }
    }
    std::vector<int32_t> i32(1000);
    std::vector<int64_t> i64(1000);
    for (int i = 0; i < 1000; ++i) i32[i] = (r + 1) * i, i64[i] = (int64_t(r) << 40) - i;
    c->all_reduce(tensor(i32, DType::I32), ReduceOp::Sum);
    c->all_reduce(tensor(i64, DType::I64), ReduceOp::Max);
    for (int i = 0; i < 1000; ++i) {
      CHILD_CHECK(i32[i] == tri * i, "i32 sum");
      CHILD_CHECK(i64[i] == (int64_t(N - 1) << 40) - i, "i64 max");
    }
    std::vector<float> m = {float(r), float(-r), r == 1 ? 7.5f : -1.f};
    c->all_reduce(tensor(m, DType::F32), ReduceOp::Max);
    CHILD_CHECK(m[0] == N - 1 && m[1] == 0 && m[2] == 7.5f, "f32 max");

    // all_gather of bf16 patterns (any dtype moves as bytes).
    std::vector<uint16_t> in(999), out(N * 999);
    for (int i = 0; i < 999; ++i) in[i] = uint16_t(r * 1000 + i);
    c->all_gather(tensor(out, DType::BF16), tensor(in, DType::BF16));
    for (int q = 0; q < N; ++q)
      for (int i = 0; i < 999; ++i) CHILD_CHECK(out[q * 999 + i] == uint16_t(q * 1000 + i), "all_gather");

    // reduce_scatter: f32 sum and i64 max, chunk q to rank q.
    for (int64_t k : {int64_t(1), int64_t(70001)}) {
      std::vector<float> big(N * k), mine(k, -1.f);
      for (int64_t j = 0; j < N * k; ++j) big[j] = float((r + 1) * (j % 5 + 1));
      c->reduce_scatter(tensor(mine, DType::F32), tensor(big, DType::F32), ReduceOp::Sum);
      for (int64_t i = 0; i < k; ++i) CHILD_CHECK(mine[i] == float(tri * ((r * k + i) % 5 + 1)), "reduce_scatter");
    }
    std::vector<int64_t> bl(N * 10), ml(10);
    for (int j = 0; j < N * 10; ++j) bl[j] = r == (j % N) ? 1000 + j : j;
    c->reduce_scatter(tensor(ml, DType::I64), tensor(bl, DType::I64), ReduceOp::Max);
    for (int i = 0; i < 10; ++i) {
      const int j = r * 10 + i;
      CHILD_CHECK(ml[i] == 1000 + j, "reduce_scatter max");
    }

    // broadcast from rank 1.
    std::vector<int32_t> b(12345, r == 1 ? 42 : 0);
    c->broadcast(tensor(b, DType::I32), 1);
    for (int x : b) CHILD_CHECK(x == 42, "broadcast");

    // send/recv around the ring, three messages in order; even ranks send first.
    const int next = (r + 1) % N, prev = (r + N - 1) % N;
    for (int msg = 0; msg < 3; ++msg) {
      std::vector<int32_t> o(257, r * 10 + msg), i(257, -1);
      if (r % 2 == 0) {
        c->send(tensor(o, DType::I32), next);
        c->recv(tensor(i, DType::I32), prev);
      } else {
        c->recv(tensor(i, DType::I32), prev);
        c->send(tensor(o, DType::I32), next);
      }
      for (int x : i) CHILD_CHECK(x == prev * 10 + msg, "send/recv order");
    }

    // async: several in flight, then a synchronous call, then wait.
    std::vector<std::vector<float>> bufs(4, std::vector<float>(50000, float(r + 1)));
    std::vector<std::unique_ptr<Work>> works;
    for (auto& buf : bufs) works.push_back(c->all_reduce_async(tensor(buf, DType::F32), ReduceOp::Sum));
    std::vector<float> after(3, 1.f);
    c->all_reduce(tensor(after, DType::F32), ReduceOp::Sum);
    for (auto& w : works) w->wait();
    for (auto& buf : bufs)
      for (float x : buf) CHILD_CHECK(x == float(tri), "async all_reduce");
    CHILD_CHECK(after[0] == float(N), "sync after async");
    c->barrier();
    return 0;
  });
}

// --deterministic-mode's sums (comm/ordered_sum.h) over Gloo's ring: ranks holding 1e8, 1e8, 3, 7
// sum to 2e8 + 16 in the canonical order (1e8 + 1e8) + (3 + 7), while every left-to-right order,
// the ring's rotated ones included, gives 2e8 (f32 spacing 16 there, so 3 and 7 vanish one at a
// time). 10 elements over 4 ranks: unequal chunks in the all-reduce.
TEST(GlooComm, OrderedSumsAddInTheCanonicalOrder) {
  constexpr int N = 4, K = 10;
  run_ranks(N, [](int) {
    auto c = world_from_env(20s);
    const float mine = std::array<float, N>{1e8f, 1e8f, 3.f, 7.f}[c->rank()], canonical = 2e8f + 16.f;
    std::vector<float> ring(K, mine), ordered(K, mine), big(N * K, mine), chunk(K, -1.f);
    c->all_reduce(tensor(ring, DType::F32), ReduceOp::Sum);
    ordered_all_reduce_sum(*c, tensor(ordered, DType::F32));
    ordered_reduce_scatter_sum(*c, tensor(chunk, DType::F32), tensor(big, DType::F32));
    for (int i = 0; i < K; ++i) {
      CHILD_CHECK(ring[i] == 2e8f, "Gloo's all_reduce adds in a left-to-right order: " + std::to_string(ring[i]));
      CHILD_CHECK(ordered[i] == canonical, "ordered_all_reduce_sum at " + std::to_string(i) + ": " +
                                               std::to_string(ordered[i]));
      CHILD_CHECK(chunk[i] == canonical, "ordered_reduce_scatter_sum at " + std::to_string(i));
    }
    return 0;
  });
}

TEST(GlooComm, SubgroupsFromTopologyTalkOnlyWithinTheirGroup) {
  constexpr int N = 4;
  run_ranks(N, [](int) {
    auto world = world_from_env(20s);
    const int r = world->rank();
    Topology topo(N, r, /*tp=*/2, /*pp=*/2);  // DP 1: tp [0,1] [2,3], pp [0,2] [1,3]
    ParallelGroups g = create_parallel_groups(*world, topo);
    CHILD_CHECK(g.tp && g.dp && g.pp && g.model_parallel && g.embedding, "groups");
    CHILD_CHECK(g.tp->world_ranks() == Topology::group_of(topo.tp_groups(), r), "tp ranks");
    CHILD_CHECK(g.pp->world_ranks() == Topology::group_of(topo.pp_groups(), r), "pp ranks");
    CHILD_CHECK(g.dp->size() == 1 && g.dp->world_ranks() == std::vector<int>{r}, "dp ranks");
    CHILD_CHECK((g.position_embedding != nullptr) == topo.is_first_stage(), "pos_embd");
    CHILD_CHECK(g.tp->group_name() == "tp", g.tp->group_name());
    std::vector<float> x(1000, float(r));
    g.tp->all_reduce(tensor(x, DType::F32), ReduceOp::Sum);
    const float tp_sum = float(r / 2 * 2 * 2 + 1);  // {0,1} -> 1, {2,3} -> 5
    CHILD_CHECK(x[999] == tp_sum, "tp sum " + std::to_string(x[999]));
    std::vector<float> y(1000, float(r));
    g.pp->all_reduce(tensor(y, DType::F32), ReduceOp::Sum);
    CHILD_CHECK(y[0] == float(r % 2 + r % 2 + 2), "pp sum");  // {0,2} -> 2, {1,3} -> 4
    std::vector<float> z(8, 1.f);
    g.dp->all_reduce(tensor(z, DType::F32), ReduceOp::Sum);  // a group of one: unchanged
    CHILD_CHECK(z[0] == 1.f, "dp of one");
    // a send within the pp group uses pp ranks
    std::vector<int32_t> msg(16, r);
    if (topo.is_first_stage()) g.pp->send(tensor(msg, DType::I32), 1);
    else g.pp->recv(tensor(msg, DType::I32), 0);
    CHILD_CHECK(msg[0] == (topo.is_first_stage() ? r : r - 2), "pp send");
    world->barrier();
    return 0;
  });
}

TEST(GlooComm, TimeoutNamesTheCallGroupAndAbsentRank) {
  constexpr int N = 3;
  auto t0 = std::chrono::steady_clock::now();
  LocalRanksOptions o;
  o.world_size = N;
  o.timeout = 30s;
  auto results = run_local_ranks(o, [](int) {
    auto c = world_from_env(1500ms);
    std::vector<float> x(1000, 1.f);
    c->all_reduce(tensor(x, DType::F32), ReduceOp::Sum);  // everyone: call 1
    if (c->rank() == 2) {
      std::this_thread::sleep_for(5s);  // never makes call 2; exits after the others reported
      return 0;
    }
    std::printf("%s\n", error_of([&] { c->all_reduce(tensor(x, DType::F32), ReduceOp::Sum); }).c_str());
    return 0;
  });
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 20s);
  ASSERT_EQ(describe_failures(results), "");
  // Ranks 0 and 1 both name the call, the group and the absent rank; at least one of them
  // timed out itself (the other may see its peer close the connection first).
  bool someone_timed_out = false;
  for (int r = 0; r < 2; ++r) {
    const std::string& e = results[r].output;
    EXPECT_NE(e.find("all_reduce(sum) of 1000 f32 (call 2 on group 'world' (world ranks 0, 1, 2), this is world rank " +
                     std::to_string(r) + ")"),
              std::string::npos)
        << e;
    EXPECT_NE(e.find("world rank(s) 2 had not reached it"), std::string::npos) << e;
    someone_timed_out = someone_timed_out || e.find("timed out after 1.5 s") != std::string::npos;
  }
  EXPECT_TRUE(someone_timed_out) << results[0].output << results[1].output;
  std::printf("rank 0 reported:\n%s", results[0].output.c_str());  // the message users will see
  EXPECT_NE((results[0].output + results[1].output).find("--distributed-timeout-minutes"), std::string::npos);
}

// Asynchronous p2p over real sockets: batched exchanges with both ring neighbours (messages
// larger than the socket buffers, so writes finish on Gloo's event loop), many outstanding
// messages per pair of varying sizes posted in different orders and waited newest first,
// blocking calls continuing the same per-pair sequence, and p2p between two of three ranks
// leaving the collective sequence of all three aligned.
TEST(GlooComm, AsyncPointToPointKeepsPerPairOrder) {
  constexpr int N = 3;
  run_ranks(N, [](int) {
    auto c = world_from_env(20s);
    const int r = c->rank();
    const int next = (r + 1) % N, prev = (r + N - 1) % N;
    for (int round = 0; round < 3; ++round) {
      const size_t big = 800000 + round;  // ~3 MiB
      std::vector<float> to_next(big, float(r * 10 + round)), to_prev(big, float(-r * 10 - round));
      std::vector<float> from_prev(big, 0.f), from_next(big, 0.f);
      std::vector<std::unique_ptr<Work>> batch;
      batch.push_back(c->send_async(tensor(to_next, DType::F32), next));
      batch.push_back(c->recv_async(tensor(from_prev, DType::F32), prev));
      batch.push_back(c->send_async(tensor(to_prev, DType::F32), prev));
      batch.push_back(c->recv_async(tensor(from_next, DType::F32), next));
      for (auto& w : batch) w->wait();
      CHILD_CHECK(from_prev.front() == float(prev * 10 + round) && from_prev.back() == float(prev * 10 + round),
                  "from prev");
      CHILD_CHECK(from_next.front() == float(-next * 10 - round) && from_next.back() == float(-next * 10 - round),
                  "from next");
    }

    constexpr int M = 30;
    auto value = [](int src, int dst, int k, size_t i) { return int32_t(src * 1000000 + dst * 100000 + k * 100 + i % 97); };
    std::vector<std::vector<std::vector<int32_t>>> out(N), in(N);
    for (int q = 0; q < N; ++q)
      for (int k = 0; k < M && q != r; ++k) {
        auto& o = out[q].emplace_back(k % 7 == 3 ? 70000 : k % 5 + 1);
        for (size_t i = 0; i < o.size(); ++i) o[i] = value(r, q, k, i);
        in[q].emplace_back(o.size(), -1);
      }
    std::vector<std::unique_ptr<Work>> works;
    for (int q = 0; q < N; ++q) {
      if (q == r) continue;
      if (r % 2 == 0) {
        for (int k = 0; k < M; ++k) {
          works.push_back(c->send_async(tensor(out[q][k], DType::I32), q));
          works.push_back(c->recv_async(tensor(in[q][k], DType::I32), q));
        }
      } else {
        for (int k = 0; k < M; ++k) works.push_back(c->recv_async(tensor(in[q][k], DType::I32), q));
        for (int k = 0; k < M; ++k) works.push_back(c->send_async(tensor(out[q][k], DType::I32), q));
      }
    }
    for (auto it = works.rbegin(); it != works.rend(); ++it) (*it)->wait();
    for (int q = 0; q < N; ++q)
      for (int k = 0; k < M && q != r; ++k)
        for (size_t i = 0; i < in[q][k].size(); ++i)
          CHILD_CHECK(in[q][k][i] == value(q, r, k, i),
                      "message " + std::to_string(k) + " from " + std::to_string(q) + " at " + std::to_string(i));

    // Only ranks 0 and 1 talk (blocking and async mixed); then a collective over all three.
    std::vector<int32_t> x(5, r), y(5, -1), z(5, -1);
    if (r == 0) {
      c->send(tensor(x, DType::I32), 1);
      auto w = c->recv_async(tensor(y, DType::I32), 1);
      c->recv(tensor(z, DType::I32), 1);
      w->wait();
    } else if (r == 1) {
      auto w = c->send_async(tensor(x, DType::I32), 0);
      c->recv(tensor(y, DType::I32), 0);
      c->send(tensor(x, DType::I32), 0);
      w->wait();
    }
    if (r < 2) CHILD_CHECK(y[0] == 1 - r && (r == 1 || z[4] == 1), "pair 0-1");
    std::vector<float> s(7, float(r + 1));
    c->all_reduce(tensor(s, DType::F32), ReduceOp::Sum);
    CHILD_CHECK(s[6] == 6.f, "all_reduce after p2p between two of three ranks");
    c->barrier();
    return 0;
  });
}

TEST(GlooComm, P2PWaitIsBoundedAndNamesThePeer) {
  auto t0 = std::chrono::steady_clock::now();
  LocalRanksOptions o;
  o.world_size = 2;
  o.timeout = 30s;
  auto results = run_local_ranks(o, [](int) {
    auto c = world_from_env(1500ms);
    if (c->rank() == 1) {
      std::this_thread::sleep_for(4s);  // never posts; outlives rank 0's timeout
      return 0;
    }
    std::vector<float> x(4, 1.f), y(4);
    auto s = c->send_async(tensor(x, DType::F32), 1);
    auto r = c->recv_async(tensor(y, DType::F32), 1);
    std::printf("%s\n", error_of([&] { s->wait(); }).c_str());
    std::printf("%s\n", error_of([&] { r->wait(); }).c_str());
    return 0;
  });
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 20s);
  ASSERT_EQ(describe_failures(results), "");
  const std::string& e = results[0].output;
  EXPECT_NE(e.find("send_async of 4 f32 to world rank 1 (message 1 from world rank 0 to world rank 1 on group 'world' "
                   "(world ranks 0, 1), this is world rank 0) timed out after 1.5 s: world rank 1 did not post the "
                   "matching recv in time"),
            std::string::npos)
      << e;
  EXPECT_NE(e.find("--distributed-timeout-minutes"), std::string::npos) << e;
  // The timeout closes the group's connections: the recv still outstanding is cancelled.
  EXPECT_NE(e.find("recv_async of 4 f32 from world rank 1 (message 1 from world rank 1 to world rank 0"),
            std::string::npos)
      << e;
  std::printf("rank 0 reported:\n%s", e.c_str());
}

TEST(GlooComm, WrongSocketIfnameListsTheInterfaces) {
  std::string e = error_of([] { choose_interface("tessera-nosuch0", "127.0.0.1", 29500); });
  EXPECT_NE(e.find("GLOO_SOCKET_IFNAME names 'tessera-nosuch0', which is not an interface"), std::string::npos) << e;
  EXPECT_NE(e.find("lo 127.0.0.1"), std::string::npos) << e;
  // Through the communicator: the interface is chosen before any connection is made.
  GlooOptions o;
  o.socket_ifname = "lo,tessera-nosuch0";
  o.master_addr = "127.0.0.1";
  o.master_port = 29500;
  o.timeout = 2s;
  e = error_of([&] { create_gloo_communicator(std::shared_ptr<Store>(make_local_store(1s)), 0, 2, o); });
  EXPECT_NE(e.find("'tessera-nosuch0'"), std::string::npos) << e;
  EXPECT_NE(e.find("interfaces and addresses: lo 127.0.0.1"), std::string::npos) << e;
  // An interface without an IPv4 address, where this machine has one.
  for (const auto& i : list_net_interfaces())
    if (i.ipv4.empty()) {
      e = error_of([&] { choose_interface(i.name, "127.0.0.1", 29500); });
      EXPECT_NE(e.find("'" + i.name + "', which has no IPv4 address"), std::string::npos) << e;
      break;
    }
  e = error_of([] { choose_interface(" , ", "127.0.0.1", 29500); });
  EXPECT_NE(e.find("names no interface"), std::string::npos) << e;
}

TEST(GlooComm, InterfaceFollowsTheRouteToMasterAddr) {
  auto lo = choose_interface("", "127.0.0.1", 29500);
  EXPECT_EQ(lo.ipv4, "127.0.0.1");
  EXPECT_EQ(lo.name, "lo");
  EXPECT_NE(lo.reason.find("route to MASTER_ADDR 127.0.0.1:29500"), std::string::npos);
  // MASTER_ADDR = one of this host's own addresses (node 0's view): the route runs through
  // loopback but the source address, and so the interface, is the real one.
  for (const auto& i : list_net_interfaces()) {
    if (i.loopback || i.ipv4.empty() || !i.up) continue;
    auto c = choose_interface("", i.ipv4.front(), 29500);
    EXPECT_EQ(c.name, i.name);
    EXPECT_EQ(c.ipv4, i.ipv4.front());
    break;
  }
  auto named = choose_interface("lo", "192.0.2.200", 29500);
  EXPECT_EQ(named.name, "lo");
  EXPECT_EQ(named.reason, "GLOO_SOCKET_IFNAME=lo");
  auto single = choose_interface("", "", 0);
  EXPECT_EQ(single.ipv4, "127.0.0.1");
}

// The host-staged path over real processes: tensors of the strict device (host memory that
// refuses host access) go through pinned copies and leave the values the host path gives
// (host_staged_test.cpp covers every call and OpenCL with in-process ranks).
TEST(GlooComm, StrictDeviceTensorsAreStagedThroughHostMemory) {
  constexpr int N = 2;
  run_ranks(N, [](int) {
    auto c = world_from_env(20s);
    const int r = c->rank();
    Device& dev = strict_device();
    auto on_device = [&](Buffer& b, const std::vector<float>& v) {
      b = Buffer(dev, v.size() * sizeof(float));
      Tensor t(b.handle(), 0, DType::F32, {static_cast<int64_t>(v.size())}, &dev);
      copy_from_host(t, v.data(), t.bytes());
      return t;
    };
    Buffer xb, gb, pb;
    std::vector<float> x(1000);
    for (int i = 0; i < 1000; ++i) x[i] = float((r + 1) * (i % 5));
    Tensor xd = on_device(xb, x), gd = on_device(gb, std::vector<float>(2000)), pd = on_device(pb, x);
    c->all_reduce_async(xd, ReduceOp::Sum)->wait();
    c->all_gather(gd, pd);
    auto sent = c->send_async(pd, 1 - r);
    auto got = c->recv_async(gd.slice_rows(0, 1000), 1 - r);
    sent->wait();
    got->wait();
    std::vector<float> xs(1000), gs(2000);
    copy_to_host(xs.data(), xs.size() * 4, xd);
    copy_to_host(gs.data(), gs.size() * 4, gd);
    for (int i = 0; i < 1000; ++i) {
      CHILD_CHECK(xs[i] == float(3 * (i % 5)), "all_reduce at " + std::to_string(i));
      CHILD_CHECK(gs[i] == float((2 - r) * (i % 5)), "recv at " + std::to_string(i));  // the peer's x
      CHILD_CHECK(gs[1000 + i] == float(2 * (i % 5)), "all_gather at " + std::to_string(1000 + i));
    }
    return 0;
  });
}

TEST(GlooComm, SingleProcessWorldNeedsNoNetwork) {
  GlooOptions o;
  o.socket_ifname = "tessera-nosuch0";  // never consulted for a world of one
  auto c = create_gloo_communicator(std::shared_ptr<Store>(make_local_store(1s)), 0, 1, o);
  std::vector<float> x(3, 2.f), g(3);
  c->all_reduce(tensor(x, DType::F32), ReduceOp::Sum);
  c->all_gather(tensor(g, DType::F32), tensor(x, DType::F32));
  c->broadcast(tensor(x, DType::F32), 0);
  c->barrier();
  c->all_reduce_async(tensor(x, DType::F32), ReduceOp::Max)->wait();
  EXPECT_EQ(x, std::vector<float>(3, 2.f));
  EXPECT_EQ(g, x);
  auto sub = c->split({{0}}, "self");
  ASSERT_TRUE(sub);
  EXPECT_EQ(sub->size(), 1);
}

TEST(CommBackend, NcclMeansTheDevicesNativeLibrary) {
  std::string e;
  const Backend& cpu_backend = *find_backend("cpu");
  auto cpu = choose_comm_backend("nccl", cpu_backend);
  EXPECT_EQ(cpu.backend, "gloo");
  EXPECT_NE(cpu.log_line.find("native collective library"), std::string::npos);
  // A backend with a native library (as CUDA registers NCCL), made here so that every build
  // runs the case.
  const NativeCollectives native{.name = "nccl"};
  const Backend gpu{.name = "gpu", .collectives = &native};
  EXPECT_EQ(choose_comm_backend("gloo", cpu_backend).backend, "gloo");
  EXPECT_EQ(choose_comm_backend("gloo", gpu).backend, "gloo");
  EXPECT_EQ(choose_comm_backend("nccl", gpu).backend, "nccl");
  // A device without a native library: Gloo on host copies, and the log says so.
  auto opencl = choose_comm_backend("nccl", Backend{.name = "opencl"});
  EXPECT_EQ(opencl.backend, "gloo");
  EXPECT_NE(opencl.log_line.find("opencl has none, so collectives are staged through host memory"), std::string::npos)
      << opencl.log_line;
  // The factory names what this build lacks and the way out.
  CommOptions o;
  o.backend = "hccl";
  e = error_of([&] { create_communicator(std::shared_ptr<Store>(make_local_store(1s)), 0, 1, o); });
  EXPECT_NE(e.find("this build has no 'hccl' communicator"), std::string::npos) << e;
  EXPECT_NE(e.find("--distributed-backend gloo"), std::string::npos) << e;
  e = error_of([&] { choose_comm_backend("mpi", cpu_backend); });
  EXPECT_NE(e.find("--distributed-backend must be nccl or gloo, got 'mpi'"), std::string::npos) << e;
}
