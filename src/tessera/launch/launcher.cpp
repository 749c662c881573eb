#include "tessera/launch/launcher.h"

#include <fcntl.h>
#include <netdb.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>

#include "tessera/comm/store.h"
#include "tessera/core/error.h"
#include "tessera/launch/local_group.h"
#include "tessera/launch/process.h"
#include "tessera/launch/rendezvous.h"
#include "tessera/launch/worker_env.h"

namespace tessera::launch {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

milliseconds ms_of(double seconds) { return milliseconds(static_cast<int64_t>(seconds * 1000.0)); }

std::string basename_of(const std::string& path) {
  auto slash = path.rfind('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

std::string this_hostname() {
  char buf[256] = {};
  if (::gethostname(buf, sizeof buf - 1) != 0) return "unknown-host";
  return buf;
}

std::string random_run_id() {
  unsigned char b[8] = {};
  int fd = ::open("/dev/urandom", O_RDONLY | O_CLOEXEC);
  if (fd >= 0) {
    ssize_t n = ::read(fd, b, sizeof b);
    (void)n;
    ::close(fd);
  }
  char hex[17];
  for (int i = 0; i < 8; ++i) std::snprintf(hex + 2 * i, 3, "%02x", b[i]);
  return std::string("standalone-") + hex;
}

void say(const std::string& line) { write_all(2, "tessera launch: " + line + "\n"); }

// Waits until a TCP connection to host:port succeeds, so that a signal can interrupt the
// wait (connect_tcp_store itself only returns at its deadline).
enum class Reach { Reached, Interrupted, TimedOut };
Reach wait_reachable(const std::string& host, int port, Clock::time_point deadline, SignalWatcher& watcher,
                     std::vector<int>& signals, std::string& last_error) {
  for (;;) {
    addrinfo hints{};
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    addrinfo* res = nullptr;
    int gai = ::getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &res);
    if (gai == EAI_NONAME)
      throw usage_error("'" + host + "' is not a known host name or address (" + gai_strerror(gai) + ")",
                        "give --master_addr (or MASTER_ADDR, or --rdzv_endpoint) node 0's IP address or "
                        "resolvable host name");
    if (gai != 0) last_error = std::string("address lookup failed: ") + gai_strerror(gai);
    bool reached = false;
    for (addrinfo* ai = res; ai && !reached; ai = ai->ai_next) {
      int fd = ::socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, ai->ai_protocol);
      if (fd < 0) continue;
      int err = 0;
      if (::connect(fd, ai->ai_addr, ai->ai_addrlen) == 0) {
        reached = true;
      } else if (errno == EINPROGRESS) {
        pollfd p{fd, POLLOUT, 0};
        if (::poll(&p, 1, 500) == 1) {
          socklen_t len = sizeof err;
          ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len);
          reached = err == 0;
        } else {
          err = ETIMEDOUT;
        }
      } else {
        err = errno;
      }
      if (!reached) last_error = std::strerror(err);
      ::close(fd);
    }
    if (res) ::freeaddrinfo(res);
    if (reached) return Reach::Reached;
    if (Clock::now() >= deadline) return Reach::TimedOut;
    pollfd p{watcher.fd(), POLLIN, 0};
    ::poll(&p, 1, 250);
    for (int s : watcher.take()) signals.push_back(s);
    if (!signals.empty()) return Reach::Interrupted;
  }
}

bool is_loopback_name(const std::string& host) {
  return host == "localhost" || host.rfind("127.", 0) == 0 || host == "::1";
}

struct Layout {
  int world_size = 0;
  int first_rank = 0;
};

Layout layout_of(const std::vector<NodeInfo>& nodes, int me) {
  Layout l;
  for (const auto& n : nodes) {
    if (n.node_rank < me) l.first_rank += n.nproc;
    l.world_size += n.nproc;
  }
  return l;
}

void print_tail(const std::string& title, const std::vector<std::string>& lines) {
  if (lines.empty()) {
    say(title + ": (no output)");
    return;
  }
  std::string block = "tessera launch: " + title + ":\n";
  for (const auto& l : lines) block += "  | " + l + "\n";
  write_all(2, block);
}

void report_killed(const std::vector<int>& ranks, double grace_s, int sig) {
  if (ranks.empty()) return;
  std::string list;
  for (int r : ranks) list += (list.empty() ? "" : ", ") + std::to_string(r);
  char grace[32];
  std::snprintf(grace, sizeof grace, "%g", grace_s);
  say(std::string(ranks.size() == 1 ? "rank " : "ranks ") + list + " did not exit within " + grace + " s of " +
      signal_name(sig) + ": killed with SIGKILL");
}

}  // namespace

bool is_local_address(const std::string& host) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  if (::getaddrinfo(host.c_str(), "0", &hints, &res) != 0) return false;
  bool local = false;
  for (addrinfo* ai = res; ai && !local; ai = ai->ai_next) {
    int fd = ::socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol);
    if (fd < 0) continue;
    local = ::bind(fd, ai->ai_addr, ai->ai_addrlen) == 0;
    ::close(fd);
  }
  ::freeaddrinfo(res);
  return local;
}

Program resolve_program(const LaunchOptions& o, const std::string& self_exe,
                        const std::vector<std::string>& subcommands) {
  TESSERA_CHECK(!o.program.empty(), "parse_launch_options requires a program");
  const std::string& first = o.program[0];
  std::vector<std::string> rest(o.program.begin() + 1, o.program.end());
  auto self = [&](std::vector<std::string> head) {
    Program p{self_exe, {"tessera"}, ""};
    p.argv.insert(p.argv.end(), head.begin(), head.end());
    p.argv.insert(p.argv.end(), rest.begin(), rest.end());
    return p;
  };
  auto python = [&](std::vector<std::string> head) {
    std::string py = find_executable("python3");
    if (py.empty()) py = find_executable("python");
    if (py.empty())
      throw usage_error("no python3 on PATH to run " + first, "pass --no-python to run it as an executable");
    Program p{py, {basename_of(py)}, ""};
    p.argv.insert(p.argv.end(), head.begin(), head.end());
    p.argv.insert(p.argv.end(), rest.begin(), rest.end());
    return p;
  };
  if (o.module) return python({"-m", first});
  if (first == "tessera") return self({});
  if (first.find('/') == std::string::npos) {
    if (std::find(subcommands.begin(), subcommands.end(), first) != subcommands.end()) return self({first});
    if (first == "pretrain_gpt") return self({"train"});
    if (first == "preprocess_data") return self({"preprocess"});
  }
  if (!o.no_python && basename_of(first) == "pretrain_gpt.py") {
    Program p = self({"train"});
    p.note = first + " runs as `tessera train` (its flags are Megatron's); to run the Python file instead, "
                     "launch `python3 " + first + " ...`";
    return p;
  }
  if (!o.no_python && ends_with(first, ".py")) return python({first});
  std::string path = find_executable(first);
  if (path.empty())
    throw usage_error("cannot run '" + first + "': " +
                          (first.find('/') != std::string::npos ? "no executable file there"
                                                                : "not a tessera subcommand and not found on PATH"),
                      "give a path to an executable, a program on PATH, or a tessera subcommand such as `train`");
  Program p{path, o.program, ""};
  return p;
}

int run_launcher(const LaunchOptions& o, const Program& program) {
  SignalWatcher watcher;
  std::vector<int> signals;
  const auto started = Clock::now();
  const auto join_deadline = started + ms_of(o.join_timeout_s);

  // ---- the store: serve it here, or find it -------------------------------------------------
  const Endpoint ep = store_endpoint(o);
  const std::string run_id = o.standalone ? random_run_id() : o.rdzv_id;
  const char* token_env = std::getenv("TESSERA_JOB_TOKEN");
  const std::string token = token_env && *token_env ? token_env : derived_job_token(run_id, ep.port);
  const std::string host = o.local_addr.empty() ? this_hostname() : o.local_addr;
  const bool dynamic_rank = !o.node_rank.has_value();
  bool serve = dynamic_rank ? o.is_host.value_or(is_local_address(ep.host)) : *o.node_rank == 0;

  std::unique_ptr<TcpStoreServer> server;
  int port = ep.port;
  if (serve) {
    try {
      server = std::make_unique<TcpStoreServer>(ep.port, token);
      port = server->port();
    } catch (const Error&) {
      if (!dynamic_rank || o.is_host.has_value()) throw;
      serve = false;  // another launcher on this machine serves it; join that one
    }
  }
  const std::string store_host = o.standalone ? "127.0.0.1" : ep.host;
  const std::string store_text = store_host + ":" + std::to_string(port);
  const std::string me_text = dynamic_rank && !serve ? "this node" : "node " + std::to_string(o.node_rank.value_or(0));

  const std::string timeout_text = std::to_string(static_cast<int>(o.join_timeout_s)) + " s";
  const std::string loopback_note =
      o.nnodes > 1 && is_loopback_name(store_host)
          ? " (" + store_host + " is a loopback address: that only works when every node runs on this machine)"
          : "";
  // The host reaches its own store on the loopback (its --master_addr may be an address that
  // only the other nodes can use, such as a public one behind NAT).
  const std::string connect_host = serve ? "127.0.0.1" : store_host;
  std::string last_error = "no attempt";
  switch (wait_reachable(connect_host, port, join_deadline, watcher, signals, last_error)) {
    case Reach::Reached:
      break;
    case Reach::Interrupted:
      say("interrupted by " + signal_name(signals.front()) + " while waiting for the store at " + store_text);
      return 128 + signals.front();
    case Reach::TimedOut:
      throw runtime_error(
          me_text + " (" + host + ") could not reach the rendezvous store at " + store_text + " within " +
              timeout_text + " (last error: " + last_error + ")",
          "node 0's `tessera launch` serves the store: start it with the same --nnodes, --master_addr, "
          "--master_port (or --rdzv_endpoint) and --rdzv_id; the nodes may start in any order within "
          "--rdzv_conf join_timeout (" + timeout_text + "). Check that this node reaches " + store_host +
              loopback_note + " (ping it), that no firewall blocks TCP port " + std::to_string(port) +
              ", and that --master_addr is node 0's address as this node sees it");
  }
  std::unique_ptr<Store> store;
  try {
    auto left = std::max(milliseconds(1000), std::chrono::duration_cast<milliseconds>(join_deadline - Clock::now()));
    store = connect_tcp_store(connect_host, port, token, left);
  } catch (const Error& e) {
    throw Error(e.kind(), me_text + " (" + host + "): " + e.what(), e.hint());
  }

  // ---- join -----------------------------------------------------------------------------------
  RendezvousConfig rc;
  rc.nnodes = o.nnodes;
  rc.node_rank = dynamic_rank ? -1 : *o.node_rank;
  rc.is_host = serve;
  rc.host = host;
  rc.nproc = o.nproc_per_node;
  rc.pid = static_cast<long>(::getpid());
  rc.store_address = store_text;
  rc.config = "nnodes=" + std::to_string(o.nnodes) + " max_restarts=" + std::to_string(o.max_restarts) +
              " run_id=" + run_id;
  rc.join_timeout = std::chrono::duration_cast<milliseconds>(join_deadline - started);
  rc.join_started = started;
  rc.keep_alive_interval = ms_of(o.keep_alive_interval_s);
  rc.keep_alive_max_attempt = o.keep_alive_max_attempt;
  rc.loopback_note = loopback_note;
  rc.rejoin_hint = "--nnodes " + std::to_string(o.nnodes) + " --node_rank <missing rank> " +
                   (o.rdzv_endpoint.empty() ? "--master_addr " + ep.host + " --master_port " + std::to_string(port)
                                            : "--rdzv_endpoint " + o.rdzv_endpoint) +
                   (run_id != "none" ? " --rdzv_id " + run_id : "");
  NodeRendezvous rdzv(*store, rc);
  auto joined = rdzv.join([&] {
    pollfd p{watcher.fd(), POLLIN, 0};
    ::poll(&p, 1, 0);
    for (int s : watcher.take()) signals.push_back(s);
    return signals.empty();
  });
  if (!joined) {
    say("interrupted by " + signal_name(signals.front()) + " while waiting for the other nodes at " + store_text);
    return 128 + signals.front();
  }
  const int me = rdzv.node_rank();
  const Layout layout = layout_of(*joined, me);
  const auto& nodes = *joined;
  auto node_text = [&](int r) { return "node " + std::to_string(r) + " (" + nodes[r].host + ")"; };

  // ---- workers ------------------------------------------------------------------------------
  const bool set_omp = o.nproc_per_node > 1 && !std::getenv("OMP_NUM_THREADS");
  if (set_omp)
    write_all(2,
              "*****************************************\n"
              "Setting OMP_NUM_THREADS environment variable for each process to be 1 in default, to avoid your "
              "system being overloaded, please further tune the variable for optimal performance in your "
              "application as needed. \n"
              "*****************************************\n");
  if (!program.note.empty()) say("note: " + program.note);
  const std::string master_addr = o.standalone ? "127.0.0.1" : store_host;
  say(node_text(me) + " of " + std::to_string(o.nnodes) + ": ranks " + std::to_string(layout.first_rank) + "-" +
      std::to_string(layout.first_rank + o.nproc_per_node - 1) + " of " + std::to_string(layout.world_size) +
      "; store " + store_text + (serve ? " (served here)" : "") + "; run id " + run_id);

  OutputOptions out;
  out.prefix = o.prefix == PrefixMode::Always || (o.prefix == PrefixMode::Auto && layout.world_size > 1);
  out.log_dir = o.log_dir;
  out.redirects = o.redirects;
  out.local_ranks_filter = o.local_ranks_filter;

  const milliseconds monitor = ms_of(o.monitor_interval_s);
  int my_signal = 0;
  auto take_signal = [&](int attempt, const std::string& while_doing) {
    if (signals.empty() || my_signal) return;
    my_signal = signals.front();
    StopRecord r;
    r.shutdown = true;
    r.exit_code = 128 + my_signal;
    r.summary = node_text(me) + ": tessera launch received " + signal_name(my_signal) + while_doing;
    rdzv.publish_stop(attempt, r);
  };
  auto lost_node_record = [&](const NodeInfo& n) {
    StopRecord r;
    r.shutdown = true;
    r.exit_code = 1;
    r.summary = "node " + std::to_string(n.node_rank) + " (" + n.host + ") has not been heard from for " +
                std::to_string(static_cast<int>(o.keep_alive_interval_s * o.keep_alive_max_attempt)) +
                " s: its launcher was killed or the network between the nodes failed";
    return r;
  };

  for (int attempt = 0;; ++attempt) {
    std::vector<LocalWorkerSpec> specs;
    for (int lr = 0; lr < o.nproc_per_node; ++lr) {
      WorkerSlot slot;
      slot.rank = layout.first_rank + lr;
      slot.local_rank = lr;
      slot.world_size = layout.world_size;
      slot.local_world_size = o.nproc_per_node;
      slot.node_rank = me;
      slot.num_nodes = o.nnodes;
      slot.master_addr = master_addr;
      slot.master_port = port;
      slot.run_id = run_id;
      slot.job_token = token;
      slot.role = o.role;
      slot.restart_count = attempt;
      slot.max_restarts = o.max_restarts;
      slot.set_omp_num_threads = set_omp;
      specs.push_back({lr, slot.rank, {program.path, program.argv, worker_variables(slot)}});
    }

    std::optional<LocalGroup> group;
    std::string how = "ok";
    try {
      try {
        group.emplace(std::move(specs), out, attempt);
      } catch (const Error& e) {
        say(std::string("error: ") + e.what() + (e.hint().empty() ? "" : "; " + e.hint()));
        StopRecord r;
        r.shutdown = true;
        r.exit_code = 1;
        r.summary = node_text(me) + " could not start its workers: " + e.what();
        rdzv.publish_stop(attempt, r);
        how = "stopped";
      }
      auto tick = [&] {
        if (auto lost = rdzv.heartbeat()) throw StoreLost(lost_node_record(*lost).summary, "");
      };
      while (group) {
        group->poll(monitor, watcher, signals);
        if (!signals.empty()) {
          take_signal(attempt, "");
          say("received " + signal_name(my_signal) + ": forwarding it to the workers; SIGKILL in " +
              std::to_string(static_cast<int>(o.signal_grace_s)) + " s (a second signal kills at once)");
          report_killed(group->stop(my_signal, o.signal_grace_s, watcher, signals, tick, monitor), o.signal_grace_s,
                        my_signal);
          how = "stopped";
          break;
        }
        if (const auto* f = group->first_failure()) {
          StopRecord r;
          r.exit_code = exit_code_of(f->status);
          r.summary = "rank " + std::to_string(f->rank) + " (local rank " + std::to_string(f->local_rank) + ") on " +
                      node_text(me) + " " + describe_wait_status(f->status);
          r.tail.assign(f->tail.lines().begin(), f->tail.lines().end());
          say(r.summary + "; stopping the other workers (SIGTERM, SIGKILL after " +
              std::to_string(static_cast<int>(o.failure_grace_s)) + " s)");
          print_tail("last " + std::to_string(r.tail.size()) + " lines of rank " + std::to_string(f->rank) +
                         "'s output",
                     r.tail);
          rdzv.publish_stop(attempt, r);
          report_killed(group->stop(SIGTERM, o.failure_grace_s, watcher, signals, tick, monitor), o.failure_grace_s,
                        SIGTERM);
          how = "failed";
          break;
        }
        if (group->all_succeeded()) break;
        if (auto notice = rdzv.stop_notice(attempt)) {
          say(notice->summary + "; stopping this node's workers");
          double grace = notice->shutdown ? o.signal_grace_s : o.failure_grace_s;
          report_killed(group->stop(SIGTERM, grace, watcher, signals, tick, monitor), grace, SIGTERM);
          how = "stopped";
          break;
        }
        tick();
      }
      take_signal(attempt, " while stopping the workers");
      if (group) group->finish(milliseconds(1000));
      rdzv.end_attempt(attempt, how);

      // Every node's workers of this attempt are gone before anyone decides.
      while (!rdzv.all_ended(attempt)) {
        pollfd p{watcher.fd(), POLLIN, 0};
        ::poll(&p, 1, static_cast<int>(std::max<int64_t>(monitor.count(), 50)));
        for (int s : watcher.take()) signals.push_back(s);
        take_signal(attempt, " while waiting for the other nodes");
        tick();
      }
    } catch (const StoreLost& e) {
      if (group) {
        group->stop(SIGTERM, o.failure_grace_s, watcher, signals, {}, monitor);
        group->finish(milliseconds(500));
      }
      // A lost node: tell the others (best effort), since they cannot end this attempt either.
      try {
        StopRecord r;
        r.shutdown = true;
        r.exit_code = 1;
        r.summary = e.what();
        rdzv.publish_stop(attempt, r);
      } catch (const std::exception&) {
      }
      write_all(2, std::string("error: ") + e.what() + "\n" + (e.hint().empty() ? "" : "hint: " + e.hint() + "\n"));
      return 1;
    }

    Decision d = rdzv.decide(attempt, o.max_restarts);
    switch (d.kind) {
      case Decision::Success:
        rdzv.leave(std::chrono::seconds(5));
        return 0;
      case Decision::Restart:
        say(d.record.summary + "; restarting the workers of every node (restart " + std::to_string(attempt + 1) +
            " of " + std::to_string(o.max_restarts) + ")");
        continue;
      case Decision::Fail:
      case Decision::Shutdown: {
        rdzv.leave(std::chrono::seconds(5));
        if (my_signal) {
          say("stopped after " + signal_name(my_signal));
          return 128 + my_signal;
        }
        std::string text = "error: " + d.record.summary + "\n";
        if (how != "failed" && !d.record.tail.empty()) {
          text += "last " + std::to_string(d.record.tail.size()) + " lines of its output:\n";
          for (const auto& l : d.record.tail) text += "  | " + l + "\n";
        }
        if (d.kind == Decision::Fail)
          text += "hint: every worker of the job was stopped" +
                  std::string(o.max_restarts ? " after " + std::to_string(o.max_restarts) + " restart(s)" : "") +
                  (o.log_dir.empty() ? "; --log-dir DIR keeps each worker's whole output"
                                     : "; each worker's whole output is under " + o.log_dir) +
                  "\n";
        write_all(2, text);
        return d.record.exit_code;
      }
    }
  }
}

}  // namespace tessera::launch
