#include "tessera/launch/local_group.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include "tessera/core/error.h"

namespace tessera::launch {
namespace {

using Clock = std::chrono::steady_clock;

int open_log(const std::string& dir, const char* name) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  std::string path = dir + "/" + name;
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0)
    throw runtime_error("cannot write " + path + ": " + std::strerror(errno),
                        "check that --log-dir is writable on this node");
  return fd;
}

}  // namespace

LocalGroup::LocalGroup(std::vector<LocalWorkerSpec> specs, const OutputOptions& output, int attempt) {
  try {
    for (auto& spec : specs) {
      Worker& w = workers_.emplace_back();
      w.local_rank = spec.local_rank;
      w.rank = spec.rank;
      w.tail = LineTail(output.tail_lines);
      int out_log = -1, err_log = -1;
      if (!output.log_dir.empty()) {
        std::string dir = output.log_dir + "/attempt_" + std::to_string(attempt) + "/" + std::to_string(spec.rank);
        out_log = open_log(dir, "stdout.log");
        err_log = open_log(dir, "stderr.log");
      }
      bool shown = output.local_ranks_filter.empty() || output.local_ranks_filter.count(spec.local_rank);
      int out_console = shown && !(output.redirects & 1) ? 1 : -1;
      int err_console = shown && !(output.redirects & 2) ? 2 : -1;
      std::string prefix = output.prefix ? "[rank" + std::to_string(spec.rank) + "]: " : "";
      SpawnedWorker s;
      try {
        s = spawn_worker(spec.spawn);
      } catch (...) {
        if (out_log >= 0) ::close(out_log);
        if (err_log >= 0) ::close(err_log);
        workers_.pop_back();
        throw;
      }
      w.pid = s.pid;
      w.running = true;
      w.out = OutputRelay(s.stdout_fd, out_console, prefix, out_log, &w.tail);
      w.err = OutputRelay(s.stderr_fd, err_console, prefix, err_log, &w.tail);
    }
  } catch (...) {
    signal_running(SIGKILL);
    for (auto& w : workers_)
      if (w.running) ::waitpid(w.pid, &w.status, 0);
    throw;
  }
}

LocalGroup::~LocalGroup() {
  for (auto& w : workers_) ::kill(-w.pid, SIGKILL);
  for (auto& w : workers_) {
    if (!w.running) continue;
    while (::waitpid(w.pid, &w.status, 0) < 0 && errno == EINTR) {
    }
    w.running = false;
  }
}

void LocalGroup::reap() {
  for (auto& w : workers_) {
    if (!w.running) continue;
    int status = 0;
    pid_t r = ::waitpid(w.pid, &status, WNOHANG);
    if (r == w.pid) {
      w.running = false;
      w.status = status;
      w.exit_order = reaped_++;
      // Read what the worker wrote before it went, so a failure report has its last lines.
      w.out.pump();
      w.err.pump();
    }
  }
}

void LocalGroup::poll(std::chrono::milliseconds timeout, SignalWatcher& watcher, std::vector<int>& signals) {
  std::vector<pollfd> fds;
  fds.push_back({watcher.fd(), POLLIN, 0});
  for (auto& w : workers_) {
    if (w.out.open()) fds.push_back({w.out.fd(), POLLIN, 0});
    if (w.err.open()) fds.push_back({w.err.fd(), POLLIN, 0});
  }
  int ms = static_cast<int>(std::max<int64_t>(0, timeout.count()));
  int n = ::poll(fds.data(), fds.size(), ms);
  if (n < 0 && errno != EINTR) throw runtime_error(std::string("poll: ") + std::strerror(errno));
  for (int s : watcher.take()) signals.push_back(s);
  for (auto& w : workers_) {
    w.out.pump();
    w.err.pump();
  }
  reap();
}

const LocalGroup::Worker* LocalGroup::first_failure() const {
  const Worker* first = nullptr;
  for (const auto& w : workers_)
    if (!w.running && w.status != 0 && (!first || w.exit_order < first->exit_order)) first = &w;
  return first;
}

bool LocalGroup::all_exited() const { return running() == 0; }

bool LocalGroup::all_succeeded() const {
  for (const auto& w : workers_)
    if (w.running || w.status != 0) return false;
  return true;
}

int LocalGroup::running() const {
  int n = 0;
  for (const auto& w : workers_) n += w.running;
  return n;
}

void LocalGroup::signal_running(int sig) {
  for (auto& w : workers_)
    if (w.running) ::kill(-w.pid, sig);
}

std::vector<int> LocalGroup::stop(int sig, double grace_s, SignalWatcher& watcher, std::vector<int>& signals,
                      const std::function<void()>& tick, std::chrono::milliseconds tick_every, bool kill_on_signal) {
  reap();
  if (running() == 0) return {};
  signal_running(sig);
  auto deadline = Clock::now() + std::chrono::milliseconds(static_cast<int64_t>(grace_s * 1000));
  auto next_tick = Clock::now() + tick_every;
  while (running() > 0 && Clock::now() < deadline) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(std::min(deadline, next_tick) - Clock::now());
    size_t before = signals.size();
    poll(std::max(left, std::chrono::milliseconds(1)), watcher, signals);
    if (kill_on_signal && signals.size() > before) break;
    if (tick && Clock::now() >= next_tick) {
      tick();
      next_tick = Clock::now() + tick_every;
    }
  }
  std::vector<int> killed;
  for (const auto& w : workers_)
    if (w.running) killed.push_back(w.rank);
  signal_running(SIGKILL);
  // SIGKILL cannot be refused; wait for the exits (bounded, in case of an unkillable D state).
  auto hard_deadline = Clock::now() + std::chrono::seconds(5);
  while (running() > 0 && Clock::now() < hard_deadline) poll(std::chrono::milliseconds(20), watcher, signals);
  return killed;
}

void LocalGroup::finish(std::chrono::milliseconds linger) {
  auto deadline = Clock::now() + linger;
  std::vector<int> ignored;
  for (;;) {
    std::vector<pollfd> fds;
    for (auto& w : workers_) {
      if (w.out.open()) fds.push_back({w.out.fd(), POLLIN, 0});
      if (w.err.open()) fds.push_back({w.err.fd(), POLLIN, 0});
    }
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
    if (fds.empty() || left <= 0) break;
    ::poll(fds.data(), fds.size(), static_cast<int>(left));
    for (auto& w : workers_) {
      w.out.pump();
      w.err.pump();
    }
  }
  // Whatever a worker left behind in its process group (a background child holding the
  // pipe, say) does not outlive the job.
  for (auto& w : workers_) ::kill(-w.pid, SIGKILL);
  for (auto& w : workers_) {
    w.out.close();
    w.err.close();
  }
}

}  // namespace tessera::launch
