// Runs the ranks of a small job as forked processes of this one, for multi-process tests and
// `tessera bench comm --spawn N`. The parent serves the job's store on an ephemeral port of
// every local address (after forking, so children inherit no threads) and each child gets
// torchrun-style variables, as `tessera launch` sets them:
//   RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, GROUP_RANK=0, GROUP_WORLD_SIZE=1,
//   MASTER_ADDR=127.0.0.1 (unless `master_addr` says otherwise), MASTER_PORT=<store port>,
//   TESSERA_LAUNCHER=local, TESSERA_JOB_TOKEN=<token>.
// A child runs body(rank); its return value is its exit status, a tessera::Error becomes
// "error: ...\nhint: ..." on stderr and status 1. Children die with the parent
// (PR_SET_PDEATHSIG) and are killed when `timeout` passes.
#pragma once

#include <chrono>
#include <functional>
#include <string>
#include <vector>

namespace tessera {

struct LocalRanksOptions {
  int world_size = 2;
  std::chrono::milliseconds timeout = std::chrono::seconds(60);
  // Capture each child's stdout and stderr (returned in LocalRankResult::output) instead of
  // letting them through to the parent's.
  bool capture_output = true;
  // false: the parent serves no store (a child serves it, e.g. inside a network namespace).
  bool serve_store = true;
  std::string master_addr = "127.0.0.1";
  // Runs in the child before the variables are set and body is called (e.g. setns).
  std::function<void(int rank)> child_setup;
};

struct LocalRankResult {
  int rank = 0;
  int exit_code = -1;    // the exit status, or -1 when killed by a signal
  int term_signal = 0;   // the signal that ended it, 0 if it exited
  bool timed_out = false;
  std::string output;    // stdout then stderr, when captured
};

std::vector<LocalRankResult> run_local_ranks(const LocalRanksOptions& options,
                                             const std::function<int(int rank)>& body);

// "rank 1: exit 1\n<its output>" for every rank that did not exit 0; "" when all did.
std::string describe_failures(const std::vector<LocalRankResult>& results);

}  // namespace tessera
