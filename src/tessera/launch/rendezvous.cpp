#include "tessera/launch/rendezvous.h"

#include <algorithm>
#include <sstream>
#include <thread>

namespace tessera::launch {
namespace {

std::vector<uint8_t> bytes(const std::string& s) { return {s.begin(), s.end()}; }
std::string text(const std::vector<uint8_t>& b) { return {b.begin(), b.end()}; }

std::string node_key(int r) { return "launch/node/" + std::to_string(r); }
std::string stop_key(int attempt) { return "launch/stop/a" + std::to_string(attempt); }
std::string ended_key(int attempt, int r) {
  return "launch/a" + std::to_string(attempt) + "/ended/" + std::to_string(r);
}
const char* kShutdownKey = "launch/shutdown";

std::string seconds_text(std::chrono::milliseconds ms) {
  std::ostringstream s;
  s << static_cast<double>(ms.count()) / 1000.0 << " s";
  return s.str();
}

}  // namespace

std::string encode_node_info(const NodeInfo& info) {
  return "host=" + info.host + "\nnproc=" + std::to_string(info.nproc) + "\npid=" + std::to_string(info.pid) + "\n";
}

NodeInfo decode_node_info(int node_rank, const std::vector<uint8_t>& b) {
  NodeInfo info;
  info.node_rank = node_rank;
  std::istringstream in(text(b));
  std::string line;
  while (std::getline(in, line)) {
    auto eq = line.find('=');
    if (eq == std::string::npos) continue;
    std::string k = line.substr(0, eq), v = line.substr(eq + 1);
    if (k == "host") info.host = v;
    if (k == "nproc") info.nproc = std::atoi(v.c_str());
    if (k == "pid") info.pid = std::atol(v.c_str());
  }
  return info;
}

std::string StopRecord::encode() const {
  std::string s = std::string(shutdown ? "shutdown" : "failure") + "\n" + std::to_string(exit_code) + "\n" + summary + "\n";
  for (const auto& line : tail) s += line + "\n";
  return s;
}

StopRecord StopRecord::decode(const std::vector<uint8_t>& b) {
  StopRecord r;
  std::istringstream in(text(b));
  std::string line;
  if (std::getline(in, line)) r.shutdown = line == "shutdown";
  if (std::getline(in, line)) r.exit_code = std::atoi(line.c_str());
  std::getline(in, r.summary);
  while (std::getline(in, line)) r.tail.push_back(line);
  return r;
}

NodeRendezvous::NodeRendezvous(Store& store, RendezvousConfig config) : store_(store), cfg_(std::move(config)) {}

std::string NodeRendezvous::describe_node(int r) const {
  for (const auto& n : nodes_)
    if (n.node_rank == r) return "node " + std::to_string(r) + " (" + n.host + ")";
  return "node " + std::to_string(r);
}

template <class F>
auto NodeRendezvous::guarded(const char* what, F&& f) -> decltype(f()) {
  try {
    return f();
  } catch (const StoreLost&) {
    throw;
  } catch (const std::exception& e) {
    throw StoreLost("lost the rendezvous store at " + cfg_.store_address + " while " + what + ": " + e.what(),
                    "node 0's `tessera launch` (it serves the store) has exited or the network between the "
                    "nodes failed; node 0's output says which");
  }
}

std::optional<std::vector<NodeInfo>> NodeRendezvous::join(const std::function<bool()>& keep_waiting) {
  const auto deadline = cfg_.join_started.value_or(Clock::now()) + cfg_.join_timeout;
  auto pause = [&]() {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    return keep_waiting();
  };
  if (cfg_.is_host) {
    store_.set("launch/config", bytes(cfg_.config));
  } else {
    // The host writes its settings right after it starts serving.
    while (!store_.check({"launch/config"})) {
      if (Clock::now() >= deadline)
        throw runtime_error("the store at " + cfg_.store_address + " has no launcher settings after " +
                                seconds_text(cfg_.join_timeout),
                            "another program than node 0's `tessera launch` is listening on that port");
      if (!pause()) return std::nullopt;
    }
    std::string theirs = text(store_.get("launch/config"));
    if (theirs != cfg_.config)
      throw usage_error("this node's launch settings differ from those of the node serving the store at " +
                            cfg_.store_address + ": here \"" + cfg_.config + "\", there \"" + theirs + "\"",
                        "give every node the same --nnodes, --max-restarts and --rdzv_id");
  }
  if (cfg_.node_rank < 0) {
    if (cfg_.is_host) {
      cfg_.node_rank = 0;
    } else {
      int64_t r = store_.add("launch/next_node_rank", 1);
      if (r >= cfg_.nnodes)
        throw runtime_error("more nodes joined the rendezvous at " + cfg_.store_address + " than --nnodes " +
                                std::to_string(cfg_.nnodes),
                            "start as many launchers as --nnodes says, and only once each; check --rdzv_id");
      cfg_.node_rank = static_cast<int>(r);
    }
  }
  const int me = cfg_.node_rank;
  if (store_.add("launch/claim/" + std::to_string(me), 1) > 1) {
    std::string other;
    if (store_.check({node_key(me)})) other = " (by " + decode_node_info(me, store_.get(node_key(me))).host + ")";
    throw usage_error("node rank " + std::to_string(me) + " was already taken" + other + " at " + cfg_.store_address,
                      "give each node its own --node_rank 0.." + std::to_string(cfg_.nnodes - 1) +
                          ", and --rdzv_id a value of its own for every job");
  }
  NodeInfo mine{me, cfg_.host, cfg_.nproc, cfg_.pid};
  store_.set(node_key(me), bytes(encode_node_info(mine)));

  std::vector<std::string> keys;
  for (int r = 0; r < cfg_.nnodes; ++r) keys.push_back(node_key(r));
  while (!store_.check(keys)) {
    if (Clock::now() >= deadline) {
      std::string joined, missing;
      int n_joined = 0;
      for (int r = 0; r < cfg_.nnodes; ++r) {
        if (store_.check({keys[r]})) {
          ++n_joined;
          joined += (joined.empty() ? "" : ", ") + std::string("node ") + std::to_string(r) + " on " +
                    decode_node_info(r, store_.get(keys[r])).host;
        } else {
          missing += (missing.empty() ? "" : ", ") + std::to_string(r);
        }
      }
      throw runtime_error(
          "rendezvous at " + cfg_.store_address + " timed out after " + seconds_text(cfg_.join_timeout) + ": " +
              std::to_string(n_joined) + " of " + std::to_string(cfg_.nnodes) + " nodes joined (" + joined +
              "); node " + std::to_string(me) + " waited for node rank(s) " + missing,
          "start `tessera launch` on the missing node(s) with the same --nnodes, --master_addr, --master_port and "
          "--rdzv_id" + (cfg_.rejoin_hint.empty() ? "" : " (" + cfg_.rejoin_hint + ")") +
              " within --rdzv_conf join_timeout; check that every node reaches " + cfg_.store_address +
              cfg_.loopback_note +
              " (ping the address; a firewall must let TCP to that port through; --master_addr must be node 0's "
              "address as the other nodes see it) and that every node was given the same --nnodes");
    }
    if (!pause()) return std::nullopt;
  }
  nodes_.clear();
  for (int r = 0; r < cfg_.nnodes; ++r) nodes_.push_back(decode_node_info(r, store_.get(keys[r])));
  next_beat_ = Clock::now();
  last_seen_.clear();
  return nodes_;
}

void NodeRendezvous::publish_stop(int attempt, const StopRecord& record) {
  guarded("reporting a stop", [&] {
    std::string enc = record.encode();
    if (record.shutdown && store_.add("launch/shutdown_count", 1) == 1) store_.set(kShutdownKey, bytes(enc));
    if (store_.add(stop_key(attempt) + "/count", 1) == 1) store_.set(stop_key(attempt), bytes(enc));
  });
}

std::optional<StopRecord> NodeRendezvous::stop_notice(int attempt) {
  return guarded("watching the other nodes", [&]() -> std::optional<StopRecord> {
    if (!store_.check({stop_key(attempt)})) return std::nullopt;
    return StopRecord::decode(store_.get(stop_key(attempt)));
  });
}

std::optional<NodeInfo> NodeRendezvous::heartbeat() {
  return guarded("exchanging heartbeats", [&]() -> std::optional<NodeInfo> {
    auto now = Clock::now();
    if (now < next_beat_) return std::nullopt;
    next_beat_ = now + cfg_.keep_alive_interval;
    store_.add("launch/hb/" + std::to_string(cfg_.node_rank), 1);
    const auto silence = cfg_.keep_alive_interval * cfg_.keep_alive_max_attempt;
    for (const auto& n : nodes_) {
      if (n.node_rank == cfg_.node_rank) continue;
      int64_t v = store_.add("launch/hb/" + std::to_string(n.node_rank), 0);
      auto it = last_seen_.find(n.node_rank);
      if (it == last_seen_.end() || it->second.first != v) {
        last_seen_[n.node_rank] = {v, now};
      } else if (now - it->second.second > silence) {
        return n;
      }
    }
    return std::nullopt;
  });
}

void NodeRendezvous::end_attempt(int attempt, const std::string& how) {
  guarded("ending an attempt", [&] { store_.set(ended_key(attempt, cfg_.node_rank), bytes(how)); });
}

bool NodeRendezvous::all_ended(int attempt) {
  return guarded("waiting for the other nodes", [&] {
    std::vector<std::string> keys;
    for (int r = 0; r < cfg_.nnodes; ++r) keys.push_back(ended_key(attempt, r));
    return store_.check(keys);
  });
}

Decision NodeRendezvous::decide(int attempt, int max_restarts) {
  return guarded("agreeing on the outcome", [&] {
    Decision d;
    if (store_.check({kShutdownKey})) {
      d.kind = Decision::Shutdown;
      d.record = StopRecord::decode(store_.get(kShutdownKey));
    } else if (store_.check({stop_key(attempt)})) {
      d.record = StopRecord::decode(store_.get(stop_key(attempt)));
      d.kind = d.record.shutdown ? Decision::Shutdown : attempt < max_restarts ? Decision::Restart : Decision::Fail;
    }
    return d;
  });
}

void NodeRendezvous::leave(std::chrono::milliseconds max_wait) {
  try {
    store_.add("launch/left", 1);
    if (!cfg_.is_host) return;
    auto deadline = Clock::now() + max_wait;
    while (store_.add("launch/left", 0) < cfg_.nnodes && Clock::now() < deadline)
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
  } catch (const std::exception&) {
    // Leaving is best effort: the outcome is already decided.
  }
}

}  // namespace tessera::launch
