// The workers of one node for one attempt: started together, their output relayed, their
// exits collected, and stopped together (signal, grace period while output keeps flowing,
// then SIGKILL to each worker's whole process group).
#pragma once

#include <sys/types.h>

#include <chrono>
#include <deque>
#include <functional>
#include <set>
#include <string>
#include <vector>

#include "tessera/launch/process.h"

namespace tessera::launch {

struct OutputOptions {
  bool prefix = false;           // "[rank<N>]: " before each console line
  std::string log_dir;           // "" : no files
  int redirects = 0;             // bit 1: stdout, bit 2: stderr kept off the console
  std::set<int> local_ranks_filter;  // console shows only these; empty: all
  size_t tail_lines = 20;
};

struct LocalWorkerSpec {
  int local_rank = 0;
  int rank = 0;
  SpawnSpec spawn;
};

class LocalGroup {
 public:
  struct Worker {
    int local_rank = 0;
    int rank = 0;
    pid_t pid = -1;
    bool running = false;
    int status = 0;       // wait status once exited
    int exit_order = -1;  // 0 for the first worker reaped, ...
    LineTail tail;
    OutputRelay out, err;
  };

  // Starts every worker (attempt names the --log-dir folder). If one cannot be started, the
  // ones already running are killed and the error is rethrown.
  LocalGroup(std::vector<LocalWorkerSpec> specs, const OutputOptions& output, int attempt);
  ~LocalGroup();  // SIGKILL to every worker's process group; reaps
  LocalGroup(const LocalGroup&) = delete;
  LocalGroup& operator=(const LocalGroup&) = delete;

  // Waits up to `timeout` for output, a worker's exit or a signal; relays output, reaps.
  // Terminating signals received are appended to `signals`.
  void poll(std::chrono::milliseconds timeout, SignalWatcher& watcher, std::vector<int>& signals);

  const std::deque<Worker>& workers() const { return workers_; }
  const Worker* first_failure() const;  // the first worker reaped with a non-zero status
  bool all_exited() const;
  bool all_succeeded() const;
  int running() const;

  // Sends `sig` to the process group of every running worker.
  void signal_running(int sig);
  // Sends `sig`, then waits up to `grace_s` (relaying output, calling `tick` at least every
  // `tick_every`) before SIGKILL. A terminating signal meanwhile is appended to `signals`;
  // if `kill_on_signal` such a signal ends the grace period at once. Returns the ranks that
  // were still running when the grace period ended (and got SIGKILL).
  std::vector<int> stop(int sig, double grace_s, SignalWatcher& watcher, std::vector<int>& signals,
            const std::function<void()>& tick, std::chrono::milliseconds tick_every, bool kill_on_signal = true);
  // After every worker exited: reads what is left in the pipes for up to `linger`, then
  // SIGKILLs what remains of the workers' process groups and closes the pipes.
  void finish(std::chrono::milliseconds linger);

 private:
  void reap();
  std::deque<Worker> workers_;  // a deque: relays point at their worker's tail
  int reaped_ = 0;
};

}  // namespace tessera::launch
