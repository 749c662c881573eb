// The doctor's checks across the world communicator (world_checks.h).
#include "tessera/doctor/world_checks.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <map>
#include <utility>

namespace tessera::doctor {
namespace {

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

std::string size_text(int64_t bytes) {
  if (bytes >= (1 << 20)) return std::to_string(bytes >> 20) + " MiB";
  if (bytes >= (1 << 10)) return std::to_string(bytes >> 10) + " KiB";
  return std::to_string(bytes) + " B";
}

Tensor host_tensor(void* p, DType t, int64_t n) { return Tensor(p, t, Shape{n}, nullptr); }

template <class T>
std::vector<T> all_gather_pod(Communicator& world, const T& mine) {
  std::vector<T> all(world.size());
  T copy = mine;
  world.all_gather(host_tensor(all.data(), DType::U8, static_cast<int64_t>(sizeof(T)) * world.size()),
                   host_tensor(&copy, DType::U8, sizeof(T)));
  return all;
}

std::string rank_name(int r, const std::vector<RankInfo>& info) {
  return "rank " + std::to_string(r) + " (" + std::string(info[r].host) + ")";
}

// Every rank's build hash against rank 0's.
Row same_build_row(const std::vector<RankInfo>& info) {
  const int n = static_cast<int>(info.size());
  Row row{"build: same binary", Status::Pass, "all " + std::to_string(n) + " ranks run the same tessera binary", "",
          "world"};
  std::string differ;
  for (int r = 1; r < n; ++r)
    if (info[r].build_hash != info[0].build_hash) differ += (differ.empty() ? "" : ", ") + rank_name(r, info);
  if (!differ.empty()) {
    row.status = Status::Fail;
    row.detail = differ + " run a different binary than " + rank_name(0, info);
    row.fix = "install the same tessera build on every node (same commit, same compiler and libraries)";
  }
  return row;
}

// All-reduce of exact-sum inputs ((rank + 1) * (i % 7 + 1): small integers, exact in f32) at
// three sizes: a correctness row and a bus-bandwidth row. Returns the slowest best call.
double check_all_reduce(Communicator& world, std::vector<Row>& rows) {
  const int n = world.size(), me = world.rank();
  std::string busbw;
  int64_t wrong = 0;
  double slowest_call = 0;
  for (int64_t bytes : {int64_t{4} << 10, int64_t{256} << 10, int64_t{4} << 20}) {
    const int64_t count = bytes / 4;
    std::vector<float> buf(count);
    const int iters = bytes >= (1 << 20) ? 3 : 5;
    double best = 1e30;
    for (int it = 0; it < iters + 1; ++it) {
      for (int64_t i = 0; i < count; ++i) buf[i] = static_cast<float>((me + 1) * (i % 7 + 1));
      world.barrier();
      const auto t0 = Clock::now();
      world.all_reduce(host_tensor(buf.data(), DType::F32, count), ReduceOp::Sum);
      const double t = seconds_since(t0);
      if (it > 0) best = std::min(best, t);  // the first call is warm-up
      const float sum_ranks = static_cast<float>(n * (n + 1) / 2);
      for (int64_t i = 0; i < count; ++i)
        if (buf[i] != sum_ranks * static_cast<float>(i % 7 + 1)) ++wrong;
    }
    float t = static_cast<float>(best);
    world.all_reduce(host_tensor(&t, DType::F32, 1), ReduceOp::Max);
    slowest_call = std::max(slowest_call, static_cast<double>(t));
    char b[96];
    std::snprintf(b, sizeof b, "%s%s %.3f GB/s", busbw.empty() ? "" : ", ", size_text(bytes).c_str(),
                  bytes / static_cast<double>(t) * 2.0 * (n - 1) / n / 1e9);
    busbw += b;
  }
  world.all_reduce(host_tensor(&wrong, DType::I64, 1), ReduceOp::Sum);
  rows.push_back({"collectives: all_reduce", wrong ? Status::Fail : Status::Pass,
                  wrong ? std::to_string(wrong) + " elements differ from the exact sum"
                        : "sum over " + std::to_string(n) + " ranks bit-exact at 4 KiB, 256 KiB, 4 MiB",
                  wrong ? "a rank computes or transports wrongly: run `tessera bench comm -c 1` under the "
                          "launcher and compare hosts"
                        : "",
                  "world"});
  rows.push_back({"collectives: busbw", Status::Info, "all_reduce busbw " + busbw, "", "world"});
  return slowest_call;
}

// A send/recv ring; even ranks send first (a send waits for the matching recv).
Row p2p_ring_row(Communicator& world) {
  const int n = world.size(), me = world.rank();
  const int64_t count = 1 << 18;
  std::vector<int32_t> out(count), in(count, -1);
  for (int64_t i = 0; i < count; ++i) out[i] = me * 1000003 + static_cast<int32_t>(i);
  const int next = (me + 1) % n, prev = (me + n - 1) % n;
  auto send = [&] { world.send(host_tensor(out.data(), DType::I32, count), next); };
  auto recv = [&] { world.recv(host_tensor(in.data(), DType::I32, count), prev); };
  if (me % 2 == 0) {
    send();
    recv();
  } else {
    recv();
    send();
  }
  int64_t bad = 0;
  for (int64_t i = 0; i < count; ++i)
    if (in[i] != prev * 1000003 + static_cast<int32_t>(i)) ++bad;
  world.all_reduce(host_tensor(&bad, DType::I64, 1), ReduceOp::Sum);
  return {"collectives: p2p", bad ? Status::Fail : Status::Pass,
          bad ? std::to_string(bad) + " elements wrong in a send/recv ring"
              : "send/recv ring over " + std::to_string(n) + " ranks bit-exact (1 MiB each)",
          bad ? "check the links between the ranks named by `network: links`" : "", "world"};
}

// Every pair of node leaders (the first rank of each node; a single node: ranks 0 and 1).
std::vector<std::pair<int, int>> leader_pairs(const std::vector<RankInfo>& info) {
  std::map<int, int> first_of_node;
  for (int r = 0; r < static_cast<int>(info.size()); ++r)
    if (!first_of_node.count(info[r].node_rank)) first_of_node[info[r].node_rank] = r;
  std::vector<int> leaders;
  for (auto& [node, r] : first_of_node) leaders.push_back(r);
  if (leaders.size() < 2 && info.size() >= 2) leaders = {0, 1};
  std::vector<std::pair<int, int>> pairs;
  for (size_t i = 0; i < leaders.size(); ++i)
    for (size_t j = i + 1; j < leaders.size(); ++j) pairs.push_back({leaders[i], leaders[j]});
  return pairs;
}

// Round trips of `bytes` on every pair, best of 3; each pair's GB/s summed into every rank.
std::vector<float> probe_links(Communicator& world, const std::vector<std::pair<int, int>>& pairs, int64_t bytes) {
  const int me = world.rank();
  std::vector<uint8_t> buf(bytes, 1);
  std::vector<float> gbps(pairs.size(), 0.0f);
  for (size_t k = 0; k < pairs.size(); ++k) {
    auto [a, b] = pairs[k];
    if (me != a && me != b) continue;
    Tensor t = host_tensor(buf.data(), DType::U8, bytes);
    double best = 1e30;
    for (int rep = 0; rep < 3; ++rep) {
      const auto t0 = Clock::now();
      if (me == a) {
        world.send(t, b);
        world.recv(t, b);
      } else {
        world.recv(t, a);
        world.send(t, a);
      }
      best = std::min(best, seconds_since(t0));
    }
    if (me == a) gbps[k] = static_cast<float>(2.0 * bytes / best / 1e9);
  }
  world.all_reduce(host_tensor(gbps.data(), DType::F32, static_cast<int64_t>(gbps.size())), ReduceOp::Sum);
  return gbps;
}

// The link speeds: the slowest pair named, a warning when it is 3x below the fastest.
Row links_row(Communicator& world, const DoctorOptions& opt, const std::vector<RankInfo>& info) {
  const std::vector<std::pair<int, int>> pairs = leader_pairs(info);
  const std::vector<float> gbps = probe_links(world, pairs, opt.bandwidth_bytes);
  const auto [lo, hi] = std::minmax_element(gbps.begin(), gbps.end());
  const auto& slow = pairs[lo - gbps.begin()];
  const std::string slow_link = rank_name(slow.first, info) + " <-> " + rank_name(slow.second, info);
  char b[400];
  std::snprintf(b, sizeof b, "%zu link%s probed with %s messages; slowest %s %.3f GB/s", pairs.size(),
                pairs.size() > 1 ? "s" : "", size_text(opt.bandwidth_bytes).c_str(), slow_link.c_str(), *lo);
  Row row{"network: links", Status::Pass, b, "", "world"};
  if (pairs.size() > 1) {
    std::snprintf(b, sizeof b, "; fastest %.3f GB/s", *hi);
    row.detail += b;
    if (*lo * 3 < *hi) {
      row.status = Status::Warn;
      row.fix = "the link " + slow_link +
                " is much slower than the others: check its NIC, cabling and GLOO_SOCKET_IFNAME";
    }
  }
  return row;
}

// Dataset index caches: the same files on every node (or none yet anywhere).
Row caches_agree_row(const std::vector<RankInfo>& info) {
  std::string differ;
  for (int r = 1; r < static_cast<int>(info.size()); ++r)
    if (info[r].cache_listing != info[0].cache_listing || info[r].cache_files != info[0].cache_files)
      differ += (differ.empty() ? "" : ", ") + rank_name(r, info) + " has " + std::to_string(info[r].cache_files);
  Row row{"data: caches agree", Status::Pass,
          "every rank sees the same " + std::to_string(info[0].cache_files) + " index files", "", "world"};
  if (!differ.empty()) {
    row.status = Status::Warn;
    row.detail = rank_name(0, info) + " has " + std::to_string(info[0].cache_files) + " index files; " + differ;
    row.fix =
        "harmless (each node builds identical indices under a lock), but to skip the build copy the cache "
        "folder to every node or use a shared --data-cache-path";
  }
  return row;
}

// A rank much slower than the others at the same local work.
Row rank_speed_row(const std::vector<RankInfo>& info, double slowest_all_reduce) {
  std::vector<double> t;
  for (const RankInfo& r : info) t.push_back(r.speed_seconds);
  std::vector<double> sorted = t;
  std::sort(sorted.begin(), sorted.end());
  const double median = sorted[sorted.size() / 2];
  std::string slow;
  for (int r = 0; r < static_cast<int>(t.size()); ++r)
    if (t[r] > 2.0 * median && t[r] - median > 0.02) {
      char b[120];
      std::snprintf(b, sizeof b, " %.0f ms", t[r] * 1e3);
      slow += (slow.empty() ? "" : ", ") + rank_name(r, info) + b;
    }
  char b[160];
  std::snprintf(b, sizeof b, "local work: median %.0f ms, slowest %.0f ms; slowest all_reduce call %.2f ms",
                median * 1e3, sorted.back() * 1e3, slowest_all_reduce * 1e3);
  Row row{"collectives: rank speed", Status::Pass, b, "", "world"};
  if (!slow.empty()) {
    row.status = Status::Warn;
    row.detail = "slower than twice the median (" + std::to_string(static_cast<int>(median * 1e3)) + " ms): " + slow;
    row.fix = "check that rank's host for other load, CPU frequency limits and OMP_NUM_THREADS";
  }
  return row;
}

}  // namespace

double local_speed_seconds() {
  std::vector<float> x(1 << 22, 1.0f);
  const auto t0 = Clock::now();
  for (int pass = 0; pass < 8; ++pass)
    for (float& v : x) v = v * 0.999f + 0.001f;
  volatile float sink = x[x.size() / 2];
  (void)sink;
  return seconds_since(t0);
}

std::vector<std::string> all_gather_text(Communicator& world, const std::string& mine) {
  const int n = world.size();
  int64_t len = static_cast<int64_t>(mine.size());
  std::vector<int64_t> lens(n);
  world.all_gather(host_tensor(lens.data(), DType::I64, n), host_tensor(&len, DType::I64, 1));
  const int64_t max_len = std::max<int64_t>(1, *std::max_element(lens.begin(), lens.end()));
  std::string padded = mine;
  padded.resize(max_len, '\0');
  std::string all(max_len * n, '\0');
  world.all_gather(host_tensor(all.data(), DType::U8, max_len * n), host_tensor(padded.data(), DType::U8, max_len));
  std::vector<std::string> out(n);
  for (int r = 0; r < n; ++r) out[r] = all.substr(r * max_len, lens[r]);
  return out;
}

std::vector<Row> world_checks(Communicator& world, const DoctorOptions& opt, const RankInfo& mine,
                              std::vector<RankInfo>& info) {
  info = all_gather_pod(world, mine);
  std::vector<Row> rows{same_build_row(info)};
  const double slowest_all_reduce = check_all_reduce(world, rows);
  rows.push_back(p2p_ring_row(world));
  if (info.size() > 1) rows.push_back(links_row(world, opt, info));
  if (info[0].cache_files >= 0) rows.push_back(caches_agree_row(info));
  rows.push_back(rank_speed_row(info, slowest_all_reduce));
  return rows;
}

}  // namespace tessera::doctor
