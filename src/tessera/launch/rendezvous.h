// How the launchers of a job's nodes agree, through the rendezvous store (comm/store.h):
// joining, stopping together, restarting together, and leaving.
//
// Keys (all under "launch/"; workers never write them):
//   config            what must be equal on every node (nnodes, max restarts, run id);
//                     written by the store's host, compared by the others
//   next_node_rank    counter handing out node ranks 1.. when --node_rank is not given (c10d)
//   claim/<r>         counter: a second launcher claiming node rank r is an error
//   node/<r>          "host=…\nnproc=…\npid=…" of node r; all present = everyone joined
//   hb/<r>            node r's heartbeat counter, bumped every keep_alive_interval
//   stop/a<N>         the first reason attempt N must stop: "failure|shutdown\n<exit code>\n
//                     <summary>\n<output tail>…"; polled by every node every monitor interval
//   shutdown          same format; present when the job must not restart (a signal, a node lost,
//                     a program that cannot start)
//   a<N>/ended/<r>    node r's workers of attempt N are all gone ("ok", "failed", "stopped")
//   left              counter of launchers that read the final outcome; the host waits for
//                     all of them before it stops serving the store
// After every node ended attempt N, each decides alone, and all decide the same: shutdown
// -> stop; stop/a<N> present -> restart while N < max restarts, else fail; else success.
#pragma once

#include <chrono>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "tessera/comm/store.h"
#include "tessera/core/error.h"

namespace tessera::launch {

struct NodeInfo {
  int node_rank = 0;
  std::string host;
  int nproc = 0;
  long pid = 0;
};

struct RendezvousConfig {
  int nnodes = 1;
  int node_rank = 0;       // -1: handed out on join (0 for the store's host)
  bool is_host = false;    // this launcher serves the store
  std::string host;        // this node's name in messages
  int nproc = 1;
  long pid = 0;
  std::string store_address;  // "10.0.0.1:29500", for messages
  std::string config;         // must be equal on every node
  std::chrono::milliseconds join_timeout{600000};
  // When the join began (the launcher's start); join() is called later, after the connect.
  std::optional<std::chrono::steady_clock::time_point> join_started;
  std::chrono::milliseconds keep_alive_interval{5000};
  int keep_alive_max_attempt = 3;
  std::string rejoin_hint;    // the command line a missing node should run, for timeout errors
  std::string loopback_note;  // said after the store address when it is a loopback address
};

// Why an attempt has to stop, as one node reported it.
struct StopRecord {
  bool shutdown = false;  // no restart
  int exit_code = 1;
  std::string summary;    // "rank 3 (local rank 1) on node 1 (hostB) exited with code 7"
  std::vector<std::string> tail;

  std::string encode() const;
  static StopRecord decode(const std::vector<uint8_t>& bytes);
};

struct Decision {
  enum Kind { Success, Restart, Fail, Shutdown } kind = Success;
  StopRecord record;  // for Restart, Fail and Shutdown
};

// A store operation failed after the join: the host is gone or the network failed.
class StoreLost : public Error {
 public:
  explicit StoreLost(const std::string& what, const std::string& hint) : Error(ErrorKind::Runtime, what, hint) {}
};

class NodeRendezvous {
 public:
  NodeRendezvous(Store& store, RendezvousConfig config);

  // Registers this node and waits until all nodes have. `keep_waiting` is called about every
  // 100 ms; when it returns false the wait ends with nullopt. Throws tessera::Error after the
  // join timeout naming who joined, who is missing and what to check.
  std::optional<std::vector<NodeInfo>> join(const std::function<bool()>& keep_waiting);
  int node_rank() const { return cfg_.node_rank; }

  void publish_stop(int attempt, const StopRecord& record);
  // The reason attempt N must stop, when some node published one.
  std::optional<StopRecord> stop_notice(int attempt);
  // Bumps this node's heartbeat every keep-alive interval and checks the others'; returns
  // the first node silent for interval × max attempts.
  std::optional<NodeInfo> heartbeat();

  void end_attempt(int attempt, const std::string& how);
  bool all_ended(int attempt);
  Decision decide(int attempt, int max_restarts);
  // Says this node read the outcome. The host then waits (up to `max_wait`) for the others.
  void leave(std::chrono::milliseconds max_wait);

  const std::vector<NodeInfo>& nodes() const { return nodes_; }

 private:
  template <class F>
  auto guarded(const char* what, F&& f) -> decltype(f());
  std::string describe_node(int r) const;

  Store& store_;
  RendezvousConfig cfg_;
  std::vector<NodeInfo> nodes_;
  using Clock = std::chrono::steady_clock;
  Clock::time_point next_beat_{};
  std::map<int, std::pair<int64_t, Clock::time_point>> last_seen_;
};

std::string encode_node_info(const NodeInfo& info);
NodeInfo decode_node_info(int node_rank, const std::vector<uint8_t>& bytes);

}  // namespace tessera::launch
