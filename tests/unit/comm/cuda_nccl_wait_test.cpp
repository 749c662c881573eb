// The bounded wait for non-blocking NCCL communicators (comm/nccl/nccl_wait.h), driven by a
// fake communicator so it runs without a GPU: a communicator that becomes ready returns,
// one that fails is aborted with NCCL's reason, and one whose peers never join is aborted
// at the timeout with an error naming the operation, the group and its ranks.
#include <gtest/gtest.h>

#include "tessera/comm/nccl/nccl_wait.h"

using namespace tessera;
using namespace tessera::comm_detail;
using namespace std::chrono_literals;

namespace {

const std::string kWhat =
    "ncclCommInitRank of 4 ranks on group 'world' (world ranks 0, 1, 2, 3), this is world rank 2 (GPU 0)";

// Polls that say "in progress" `busy` times, then `last`.
struct FakeComm {
  int busy = 0;
  CommPoll last{CommPoll::Ready, ""};
  int polls = 0;
  int aborts = 0;
  CommPoll poll() {
    ++polls;
    if (polls <= busy) return {CommPoll::InProgress, ""};
    return last;
  }
};

void wait(FakeComm& comm, std::chrono::milliseconds timeout) {
  wait_until_ready(kWhat, timeout, [&] { return comm.poll(); }, [&] { ++comm.aborts; });
}

}  // namespace

TEST(NcclWait, ReturnsOnceReady) {
  FakeComm comm;
  comm.busy = 5;
  wait(comm, 10s);
  EXPECT_EQ(comm.polls, 6);
  EXPECT_EQ(comm.aborts, 0);
}

TEST(NcclWait, FailureAbortsAndCarriesNcclsReason) {
  FakeComm comm;
  comm.busy = 2;
  comm.last = {CommPoll::Failed, "remote process exited or there was a network error: socket closed"};
  try {
    wait(comm, 10s);
    FAIL() << "expected an Error";
  } catch (const Error& e) {
    const std::string text = e.what();
    EXPECT_NE(text.find(kWhat + " failed: remote process exited"), std::string::npos) << text;
    EXPECT_NE(std::string(e.hint()).find("NCCL_DEBUG"), std::string::npos) << e.hint();
  }
  EXPECT_EQ(comm.aborts, 1);
}

TEST(NcclWait, PeersThatNeverJoinTimeOutNamingTheGroupAndRanks) {
  FakeComm comm;
  comm.busy = 1 << 30;
  const auto start = std::chrono::steady_clock::now();
  try {
    wait(comm, 200ms);
    FAIL() << "expected an Error";
  } catch (const Error& e) {
    const std::string text = e.what();
    // The timeout text every backend uses (group_communicator.h), with NCCL's state.
    EXPECT_NE(text.find(kWhat + " timed out after 0.2 s: NCCL still reported ncclInProgress"), std::string::npos)
        << text;
    EXPECT_NE(std::string(e.hint()).find("--distributed-timeout-minutes"), std::string::npos) << e.hint();
  }
  const auto waited = std::chrono::steady_clock::now() - start;
  EXPECT_GE(waited, 200ms);
  EXPECT_LT(waited, 2s);  // bounded by the timeout, not by the peers
  EXPECT_EQ(comm.aborts, 1);
  EXPECT_GT(comm.polls, 10);  // it polled, it did not sleep through the timeout
}

TEST(NcclWait, TimeoutMessageKeepsNcclsLastWords) {
  int aborts = 0;
  try {
    wait_until_ready(
        kWhat, 30ms, [] { return CommPoll{CommPoll::InProgress, "bootstrap: connect to 10.0.0.2<43211> refused"}; },
        [&] { ++aborts; });
    FAIL() << "expected an Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("[nccl: bootstrap: connect to 10.0.0.2<43211> refused]"), std::string::npos)
        << e.what();
  }
  EXPECT_EQ(aborts, 1);
}
