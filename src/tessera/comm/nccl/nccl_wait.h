// Waiting for a non-blocking NCCL communicator under the --distributed-timeout-minutes
// deadline. tessera makes every NCCL communicator with ncclConfig_t::blocking = 0, so
// ncclCommInitRankConfig, ncclCommSplit and the enqueueing of calls return ncclInProgress
// at once and the work goes on in the background: a rank that never joins then ends in an
// error naming the group, the operation and the ranks it waited for, where a blocking
// ncclCommInitRank would hang for ever. No NCCL types here, so the logic is tested on the
// CPU with a fake communicator (tests/unit/comm/cuda_nccl_wait_test.cpp).
#pragma once

#include <algorithm>
#include <chrono>
#include <functional>
#include <string>
#include <thread>

#include "tessera/comm/group_communicator.h"
#include "tessera/core/error.h"

namespace tessera::comm_detail {

inline constexpr const char* kNcclHint =
    "every rank must make the same calls in the same order; NCCL_DEBUG=WARN shows NCCL's own view "
    "(NCCL_DEBUG=INFO for the transports it chose)";

// One poll of ncclCommGetAsyncError.
struct CommPoll {
  enum State { InProgress, Ready, Failed };
  State state = InProgress;
  std::string reason;  // NCCL's words: "unhandled system error: socket connect failed ..." (may be empty)
};

// Polls until the communicator is ready. On failure, or when `timeout` passes first, calls
// `abort` (ncclCommAbort, the one call a half-made communicator allows) and throws an Error
// that starts with `what`, e.g. "ncclCommInitRank of 4 ranks on group 'world' (world ranks
// 0, 1, 2, 3), this is world rank 0".
inline void wait_until_ready(const std::string& what, std::chrono::milliseconds timeout,
                             const std::function<CommPoll()>& poll, const std::function<void()>& abort) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  auto pause = std::chrono::microseconds(20);  // enqueueing takes microseconds; joining peers, seconds
  for (;;) {
    const CommPoll p = poll();
    if (p.state == CommPoll::Ready) return;
    if (p.state == CommPoll::Failed) {
      abort();
      throw runtime_error(what + " failed: " + p.reason, kNcclHint);
    }
    if (std::chrono::steady_clock::now() >= deadline) {
      abort();
      throw collective_timeout(what, timeout,
                               ": NCCL still reported ncclInProgress, so not every rank joined" +
                                   (p.reason.empty() ? std::string() : " [nccl: " + p.reason + "]"));
    }
    std::this_thread::sleep_for(pause);
    pause = std::min<std::chrono::microseconds>(pause * 2, std::chrono::milliseconds(20));
  }
}

}  // namespace tessera::comm_detail
