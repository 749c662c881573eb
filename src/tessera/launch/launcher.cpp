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


// One node's launcher from start to exit, one method per phase: open the store (serve it or
// reach it), join the other nodes, then run attempts until the nodes decide together.
// Signals the watcher reports collect in signals_; the first one this node acts on is
// my_signal_ (published so that every node stops).
class NodeLauncher {
 public:
  NodeLauncher(const LaunchOptions& o, const Program& program)
      : o_(o),
        program_(program),
        started_(Clock::now()),
        join_deadline_(started_ + ms_of(o.join_timeout_s)),
        monitor_(ms_of(o.monitor_interval_s)),
        set_omp_(o.nproc_per_node > 1 && !std::getenv("OMP_NUM_THREADS")) {}

  int run();

 private:
  // Each returns an exit status when a signal interrupted the wait, else nothing.
  std::optional<int> open_store();
  std::optional<int> connect_store();
  std::optional<int> join();
  RendezvousConfig rendezvous_config() const;
  void announce() const;

  // Starts, supervises and ends one attempt on this node; returns how it ended here
  // ("ok", "stopped", "failed"). Throws StoreLost when the store or a node is lost.
  std::string run_attempt(int attempt);
  std::vector<LocalWorkerSpec> worker_specs(int attempt) const;
  OutputOptions output_options() const;
  std::string supervise(int attempt);
  void stop_after_failure(const LocalGroup::Worker& failed, int attempt);
  void wait_for_other_nodes(int attempt);

  int give_up_on_lost_node(const StoreLost& lost, int attempt);
  int conclude(const Decision& decision, const std::string& how);

  void take_signal(int attempt, const std::string& while_doing);
  void heartbeat();
  StopRecord lost_node_record(const NodeInfo& node) const;
  std::string me_text() const;
  std::string node_text(int r) const { return "node " + std::to_string(r) + " (" + nodes_[r].host + ")"; }

  const LaunchOptions& o_;
  const Program& program_;
  SignalWatcher watcher_;
  std::vector<int> signals_;
  const Clock::time_point started_;
  const Clock::time_point join_deadline_;
  const milliseconds monitor_;
  const bool set_omp_;

  Endpoint endpoint_;
  std::string run_id_, token_, host_;
  bool dynamic_rank_ = false;
  bool serve_ = false;
  int port_ = 0;
  std::string store_host_, store_text_, loopback_note_;
  std::unique_ptr<TcpStoreServer> server_;
  std::unique_ptr<Store> store_;
  std::unique_ptr<NodeRendezvous> rdzv_;
  std::vector<NodeInfo> nodes_;
  int me_ = 0;
  Layout layout_;
  int my_signal_ = 0;
  std::optional<LocalGroup> group_;  // last: its workers are killed before the store goes
};

int NodeLauncher::run() {
  if (auto interrupted = open_store()) return *interrupted;
  if (auto interrupted = join()) return *interrupted;
  announce();
  for (int attempt = 0;; ++attempt) {
    std::string how;
    try {
      how = run_attempt(attempt);
    } catch (const StoreLost& lost) {
      return give_up_on_lost_node(lost, attempt);
    }
    const Decision d = rdzv_->decide(attempt, o_.max_restarts);
    if (d.kind != Decision::Restart) return conclude(d, how);
    say(d.record.summary + "; restarting the workers of every node (restart " + std::to_string(attempt + 1) + " of " +
        std::to_string(o_.max_restarts) + ")");
  }
}

std::optional<int> NodeLauncher::open_store() {
  endpoint_ = store_endpoint(o_);
  run_id_ = o_.standalone ? random_run_id() : o_.rdzv_id;
  const char* token_env = std::getenv("TESSERA_JOB_TOKEN");
  token_ = token_env && *token_env ? token_env : derived_job_token(run_id_, endpoint_.port);
  host_ = o_.local_addr.empty() ? this_hostname() : o_.local_addr;
  dynamic_rank_ = !o_.node_rank.has_value();
  serve_ = dynamic_rank_ ? o_.is_host.value_or(is_local_address(endpoint_.host)) : *o_.node_rank == 0;
  port_ = endpoint_.port;
  if (serve_) {
    try {
      server_ = std::make_unique<TcpStoreServer>(endpoint_.port, token_);
      port_ = server_->port();
    } catch (const Error&) {
      if (!dynamic_rank_ || o_.is_host.has_value()) throw;
      serve_ = false;  // another launcher on this machine serves it; join that one
    }
  }
  store_host_ = o_.standalone ? "127.0.0.1" : endpoint_.host;
  store_text_ = store_host_ + ":" + std::to_string(port_);
  if (o_.nnodes > 1 && is_loopback_name(store_host_))
    loopback_note_ =
        " (" + store_host_ + " is a loopback address: that only works when every node runs on this machine)";
  return connect_store();
}

std::optional<int> NodeLauncher::connect_store() {
  const std::string timeout_text = std::to_string(static_cast<int>(o_.join_timeout_s)) + " s";
  // The host reaches its own store on the loopback (its --master_addr may be an address that
  // only the other nodes can use, such as a public one behind NAT).
  const std::string connect_host = serve_ ? "127.0.0.1" : store_host_;
  std::string last_error = "no attempt";
  switch (wait_reachable(connect_host, port_, join_deadline_, watcher_, signals_, last_error)) {
    case Reach::Reached:
      break;
    case Reach::Interrupted:
      say("interrupted by " + signal_name(signals_.front()) + " while waiting for the store at " + store_text_);
      return 128 + signals_.front();
    case Reach::TimedOut:
      throw runtime_error(
          me_text() + " (" + host_ + ") could not reach the rendezvous store at " + store_text_ + " within " +
              timeout_text + " (last error: " + last_error + ")",
          "node 0's `tessera launch` serves the store: start it with the same --nnodes, --master_addr, "
          "--master_port (or --rdzv_endpoint) and --rdzv_id; the nodes may start in any order within "
          "--rdzv_conf join_timeout (" + timeout_text + "). Check that this node reaches " + store_host_ +
              loopback_note_ + " (ping it), that no firewall blocks TCP port " + std::to_string(port_) +
              ", and that --master_addr is node 0's address as this node sees it");
  }
  try {
    auto left = std::max(milliseconds(1000), std::chrono::duration_cast<milliseconds>(join_deadline_ - Clock::now()));
    store_ = connect_tcp_store(connect_host, port_, token_, left);
  } catch (const Error& e) {
    throw Error(e.kind(), me_text() + " (" + host_ + "): " + e.what(), e.hint());
  }
  return std::nullopt;
}

RendezvousConfig NodeLauncher::rendezvous_config() const {
  RendezvousConfig rc;
  rc.nnodes = o_.nnodes;
  rc.node_rank = dynamic_rank_ ? -1 : *o_.node_rank;
  rc.is_host = serve_;
  rc.host = host_;
  rc.nproc = o_.nproc_per_node;
  rc.pid = static_cast<long>(::getpid());
  rc.store_address = store_text_;
  rc.config = "nnodes=" + std::to_string(o_.nnodes) + " max_restarts=" + std::to_string(o_.max_restarts) +
              " run_id=" + run_id_;
  rc.join_timeout = std::chrono::duration_cast<milliseconds>(join_deadline_ - started_);
  rc.join_started = started_;
  rc.keep_alive_interval = ms_of(o_.keep_alive_interval_s);
  rc.keep_alive_max_attempt = o_.keep_alive_max_attempt;
  rc.loopback_note = loopback_note_;
  rc.rejoin_hint = "--nnodes " + std::to_string(o_.nnodes) + " --node_rank <missing rank> " +
                   (o_.rdzv_endpoint.empty()
                        ? "--master_addr " + endpoint_.host + " --master_port " + std::to_string(port_)
                        : "--rdzv_endpoint " + o_.rdzv_endpoint) +
                   (run_id_ != "none" ? " --rdzv_id " + run_id_ : "");
  return rc;
}

std::optional<int> NodeLauncher::join() {
  rdzv_ = std::make_unique<NodeRendezvous>(*store_, rendezvous_config());
  auto joined = rdzv_->join([this] {
    pollfd p{watcher_.fd(), POLLIN, 0};
    ::poll(&p, 1, 0);
    for (int s : watcher_.take()) signals_.push_back(s);
    return signals_.empty();
  });
  if (!joined) {
    say("interrupted by " + signal_name(signals_.front()) + " while waiting for the other nodes at " + store_text_);
    return 128 + signals_.front();
  }
  nodes_ = std::move(*joined);
  me_ = rdzv_->node_rank();
  layout_ = layout_of(nodes_, me_);
  return std::nullopt;
}

void NodeLauncher::announce() const {
  if (set_omp_)
    write_all(2,
              "*****************************************\n"
              "Setting OMP_NUM_THREADS environment variable for each process to be 1 in default, to avoid your "
              "system being overloaded, please further tune the variable for optimal performance in your "
              "application as needed. \n"
              "*****************************************\n");
  if (!program_.note.empty()) say("note: " + program_.note);
  say(node_text(me_) + " of " + std::to_string(o_.nnodes) + ": ranks " + std::to_string(layout_.first_rank) + "-" +
      std::to_string(layout_.first_rank + o_.nproc_per_node - 1) + " of " + std::to_string(layout_.world_size) +
      "; store " + store_text_ + (serve_ ? " (served here)" : "") + "; run id " + run_id_);
}

std::vector<LocalWorkerSpec> NodeLauncher::worker_specs(int attempt) const {
  std::vector<LocalWorkerSpec> specs;
  for (int lr = 0; lr < o_.nproc_per_node; ++lr) {
    WorkerSlot slot;
    slot.rank = layout_.first_rank + lr;
    slot.local_rank = lr;
    slot.world_size = layout_.world_size;
    slot.local_world_size = o_.nproc_per_node;
    slot.node_rank = me_;
    slot.num_nodes = o_.nnodes;
    slot.master_addr = o_.standalone ? "127.0.0.1" : store_host_;
    slot.master_port = port_;
    slot.run_id = run_id_;
    slot.job_token = token_;
    slot.role = o_.role;
    slot.restart_count = attempt;
    slot.max_restarts = o_.max_restarts;
    slot.set_omp_num_threads = set_omp_;
    specs.push_back({lr, slot.rank, {program_.path, program_.argv, worker_variables(slot)}});
  }
  return specs;
}

OutputOptions NodeLauncher::output_options() const {
  OutputOptions out;
  out.prefix = o_.prefix == PrefixMode::Always || (o_.prefix == PrefixMode::Auto && layout_.world_size > 1);
  out.log_dir = o_.log_dir;
  out.redirects = o_.redirects;
  out.local_ranks_filter = o_.local_ranks_filter;
  return out;
}

std::string NodeLauncher::run_attempt(int attempt) {
  group_.reset();
  std::string how = "stopped";
  try {
    group_.emplace(worker_specs(attempt), output_options(), attempt);
  } catch (const Error& e) {
    say(std::string("error: ") + e.what() + (e.hint().empty() ? "" : "; " + e.hint()));
    StopRecord r;
    r.shutdown = true;
    r.exit_code = 1;
    r.summary = node_text(me_) + " could not start its workers: " + e.what();
    rdzv_->publish_stop(attempt, r);
  }
  if (group_) how = supervise(attempt);
  take_signal(attempt, " while stopping the workers");
  if (group_) group_->finish(milliseconds(1000));
  rdzv_->end_attempt(attempt, how);
  // Every node's workers of this attempt are gone before anyone decides.
  wait_for_other_nodes(attempt);
  return how;
}

std::string NodeLauncher::supervise(int attempt) {
  LocalGroup& group = *group_;
  const auto tick = [this] { heartbeat(); };
  for (;;) {
    group.poll(monitor_, watcher_, signals_);
    if (!signals_.empty()) {
      take_signal(attempt, "");
      say("received " + signal_name(my_signal_) + ": forwarding it to the workers; SIGKILL in " +
          std::to_string(static_cast<int>(o_.signal_grace_s)) + " s (a second signal kills at once)");
      report_killed(group.stop(my_signal_, o_.signal_grace_s, watcher_, signals_, tick, monitor_), o_.signal_grace_s,
                    my_signal_);
      return "stopped";
    }
    if (const auto* failed = group.first_failure()) {
      stop_after_failure(*failed, attempt);
      return "failed";
    }
    if (group.all_succeeded()) return "ok";
    if (auto notice = rdzv_->stop_notice(attempt)) {
      say(notice->summary + "; stopping this node's workers");
      const double grace = notice->shutdown ? o_.signal_grace_s : o_.failure_grace_s;
      report_killed(group.stop(SIGTERM, grace, watcher_, signals_, tick, monitor_), grace, SIGTERM);
      return "stopped";
    }
    heartbeat();
  }
}

void NodeLauncher::stop_after_failure(const LocalGroup::Worker& failed, int attempt) {
  StopRecord r;
  r.exit_code = exit_code_of(failed.status);
  r.summary = "rank " + std::to_string(failed.rank) + " (local rank " + std::to_string(failed.local_rank) + ") on " +
              node_text(me_) + " " + describe_wait_status(failed.status);
  r.tail.assign(failed.tail.lines().begin(), failed.tail.lines().end());
  say(r.summary + "; stopping the other workers (SIGTERM, SIGKILL after " +
      std::to_string(static_cast<int>(o_.failure_grace_s)) + " s)");
  print_tail("last " + std::to_string(r.tail.size()) + " lines of rank " + std::to_string(failed.rank) + "'s output",
             r.tail);
  rdzv_->publish_stop(attempt, r);
  report_killed(group_->stop(SIGTERM, o_.failure_grace_s, watcher_, signals_, [this] { heartbeat(); }, monitor_),
                o_.failure_grace_s, SIGTERM);
}

void NodeLauncher::wait_for_other_nodes(int attempt) {
  while (!rdzv_->all_ended(attempt)) {
    pollfd p{watcher_.fd(), POLLIN, 0};
    ::poll(&p, 1, static_cast<int>(std::max<int64_t>(monitor_.count(), 50)));
    for (int s : watcher_.take()) signals_.push_back(s);
    take_signal(attempt, " while waiting for the other nodes");
    heartbeat();
  }
}

int NodeLauncher::give_up_on_lost_node(const StoreLost& lost, int attempt) {
  if (group_) {
    group_->stop(SIGTERM, o_.failure_grace_s, watcher_, signals_, {}, monitor_);
    group_->finish(milliseconds(500));
  }
  // Tell the others (best effort), since they cannot end this attempt either.
  try {
    StopRecord r;
    r.shutdown = true;
    r.exit_code = 1;
    r.summary = lost.what();
    rdzv_->publish_stop(attempt, r);
  } catch (const std::exception&) {
  }
  write_all(2, std::string("error: ") + lost.what() + "\n" + (lost.hint().empty() ? "" : "hint: " + lost.hint() + "\n"));
  return 1;
}

int NodeLauncher::conclude(const Decision& d, const std::string& how) {
  rdzv_->leave(std::chrono::seconds(5));
  if (d.kind == Decision::Success) return 0;
  if (my_signal_) {
    say("stopped after " + signal_name(my_signal_));
    return 128 + my_signal_;
  }
  std::string text = "error: " + d.record.summary + "\n";
  if (how != "failed" && !d.record.tail.empty()) {
    text += "last " + std::to_string(d.record.tail.size()) + " lines of its output:\n";
    for (const auto& l : d.record.tail) text += "  | " + l + "\n";
  }
  if (d.kind == Decision::Fail)
    text += "hint: every worker of the job was stopped" +
            std::string(o_.max_restarts ? " after " + std::to_string(o_.max_restarts) + " restart(s)" : "") +
            (o_.log_dir.empty() ? "; --log-dir DIR keeps each worker's whole output"
                                : "; each worker's whole output is under " + o_.log_dir) +
            "\n";
  write_all(2, text);
  return d.record.exit_code;
}

void NodeLauncher::take_signal(int attempt, const std::string& while_doing) {
  if (signals_.empty() || my_signal_) return;
  my_signal_ = signals_.front();
  StopRecord r;
  r.shutdown = true;
  r.exit_code = 128 + my_signal_;
  r.summary = node_text(me_) + ": tessera launch received " + signal_name(my_signal_) + while_doing;
  rdzv_->publish_stop(attempt, r);
}

void NodeLauncher::heartbeat() {
  if (auto lost = rdzv_->heartbeat()) throw StoreLost(lost_node_record(*lost).summary, "");
}

StopRecord NodeLauncher::lost_node_record(const NodeInfo& node) const {
  StopRecord r;
  r.shutdown = true;
  r.exit_code = 1;
  r.summary = "node " + std::to_string(node.node_rank) + " (" + node.host + ") has not been heard from for " +
              std::to_string(static_cast<int>(o_.keep_alive_interval_s * o_.keep_alive_max_attempt)) +
              " s: its launcher was killed or the network between the nodes failed";
  return r;
}

std::string NodeLauncher::me_text() const {
  return dynamic_rank_ && !serve_ ? "this node" : "node " + std::to_string(o_.node_rank.value_or(0));
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


int run_launcher(const LaunchOptions& o, const Program& program) { return NodeLauncher(o, program).run(); }

}  // namespace tessera::launch
