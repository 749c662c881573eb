// Process primitives and one node's worker group (launch/process.h, launch/local_group.h),
// with /bin/sh scripts as workers: output relayed line by line with a prefix, log files
// byte-exact, the tail of a failed worker, process groups stopped with grace then SIGKILL.
#include <gtest/gtest.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "tessera/core/error.h"
#include "tessera/launch/local_group.h"
#include "tessera/launch/process.h"

namespace tessera::launch {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

std::string read_fd(int fd) {
  std::string s;
  char buf[4096];
  ssize_t n;
  while ((n = ::read(fd, buf, sizeof buf)) > 0) s.append(buf, static_cast<size_t>(n));
  return s;
}

std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

std::filesystem::path scratch(const char* name) {
  auto dir = std::filesystem::temp_directory_path() / ("tessera_launch_" + std::to_string(::getpid()) + "_" + name);
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir;
}

LocalWorkerSpec sh_worker(int local_rank, int rank, const std::string& script) {
  return {local_rank, rank, {"/bin/sh", {"sh", "-c", script}, {{"MY_RANK", std::to_string(rank)}}}};
}

// Alive and not a zombie (an orphan waits for whoever reaps orphans here; it is gone anyway).
bool process_exists(pid_t pid) {
  std::string stat = slurp("/proc/" + std::to_string(pid) + "/stat");
  auto close = stat.rfind(')');
  return close != std::string::npos && close + 2 < stat.size() && stat[close + 2] != 'Z';
}

TEST(LaunchProcess, RelayPrefixesLinesKeepsTailAndLogsBytes) {
  int data[2], console[2];
  ASSERT_EQ(::pipe2(data, O_NONBLOCK), 0);  // a relay reads non-blocking pipes, as spawn_worker makes them
  ASSERT_EQ(::pipe(console), 0);
  auto dir = scratch("relay");
  std::string log_path = (dir / "out.log").string();
  int log_fd = ::open(log_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  LineTail tail(2);
  {
    OutputRelay relay(data[0], console[1], "[rank3]: ", log_fd, &tail);
    std::string input = "one\ntw";
    ASSERT_EQ(::write(data[1], input.data(), input.size()), static_cast<ssize_t>(input.size()));
    relay.pump();
    input = "o\nthree\nno newline at end";
    ASSERT_EQ(::write(data[1], input.data(), input.size()), static_cast<ssize_t>(input.size()));
    ::close(data[1]);
    relay.pump();
    EXPECT_FALSE(relay.open());  // end of stream seen
  }
  ::close(console[1]);
  EXPECT_EQ(read_fd(console[0]), "[rank3]: one\n[rank3]: two\n[rank3]: three\n[rank3]: no newline at end\n");
  ::close(console[0]);
  EXPECT_EQ(slurp(log_path), "one\ntwo\nthree\nno newline at end");
  ASSERT_EQ(tail.lines().size(), 2u);
  EXPECT_EQ(tail.lines()[0], "three");
  EXPECT_EQ(tail.lines()[1], "no newline at end");
  std::filesystem::remove_all(dir);
}

TEST(LaunchProcess, WaitStatusesAreNamed) {
  EXPECT_EQ(describe_wait_status(3 << 8), "exited with code 3");
  EXPECT_EQ(exit_code_of(3 << 8), 3);
  EXPECT_EQ(describe_wait_status(SIGKILL), "was killed by signal SIGKILL (9)");
  EXPECT_EQ(exit_code_of(SIGKILL), 137);
  EXPECT_EQ(signal_name(SIGTERM), "SIGTERM");
}

TEST(LaunchProcess, SpawnFailureIsAnError) {
  SpawnSpec spec{"/nonexistent/program", {"program"}, {}};
  try {
    spawn_worker(spec);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("/nonexistent/program"), std::string::npos) << e.what();
  }
  EXPECT_NE(find_executable("sh"), "");
  EXPECT_EQ(find_executable("no-such-program-anywhere"), "");
}

TEST(LaunchProcess, GroupRunsWorkersWithTheirEnvironmentAndLogFiles) {
  auto dir = scratch("group");
  SignalWatcher watcher;
  OutputOptions out;
  out.log_dir = dir.string();
  out.redirects = 3;  // files only: keeps the test's console quiet
  std::vector<LocalWorkerSpec> specs = {sh_worker(0, 4, "echo rank=$MY_RANK; echo err >&2"),
                                        sh_worker(1, 5, "echo rank=$MY_RANK; exit 0")};
  LocalGroup group(specs, out, 2);
  std::vector<int> signals;
  auto deadline = Clock::now() + std::chrono::seconds(20);
  while (!group.all_exited() && Clock::now() < deadline) group.poll(milliseconds(50), watcher, signals);
  group.finish(milliseconds(500));
  EXPECT_TRUE(group.all_succeeded());
  EXPECT_EQ(slurp((dir / "attempt_2/4/stdout.log").string()), "rank=4\n");
  EXPECT_EQ(slurp((dir / "attempt_2/4/stderr.log").string()), "err\n");
  EXPECT_EQ(slurp((dir / "attempt_2/5/stdout.log").string()), "rank=5\n");
  std::filesystem::remove_all(dir);
}

TEST(LaunchProcess, FirstFailureHasItsTailAndStopEscalatesToSigkill) {
  SignalWatcher watcher;
  OutputOptions out;
  out.log_dir = scratch("fail").string();
  out.redirects = 3;
  // Rank 0 ignores SIGTERM (it must get SIGKILL), rank 1 fails after some output, rank 2
  // exits on SIGTERM together with the child it started (same process group).
  std::vector<LocalWorkerSpec> specs = {
      sh_worker(0, 0, "trap '' TERM; echo $$ > " + out.log_dir + "/pid0; while :; do sleep 0.05; done"),
      sh_worker(1, 1, "i=0; while [ $i -lt 30 ]; do echo line $i; i=$((i+1)); done; sleep 0.3; exit 3"),
      sh_worker(2, 2, "sleep 30 & echo $! > " + out.log_dir + "/child2; wait")};
  LocalGroup group(specs, out, 0);
  std::vector<int> signals;
  auto deadline = Clock::now() + std::chrono::seconds(20);
  while (!group.first_failure() && Clock::now() < deadline) group.poll(milliseconds(50), watcher, signals);
  const auto* failed = group.first_failure();
  ASSERT_NE(failed, nullptr);
  EXPECT_EQ(failed->rank, 1);
  EXPECT_EQ(describe_wait_status(failed->status), "exited with code 3");
  ASSERT_EQ(failed->tail.lines().size(), 20u);
  EXPECT_EQ(failed->tail.lines().front(), "line 10");
  EXPECT_EQ(failed->tail.lines().back(), "line 29");

  pid_t child2 = std::atoi(slurp(out.log_dir + "/child2").c_str());
  ASSERT_GT(child2, 0);
  auto start = Clock::now();
  int ticks = 0;
  std::vector<int> killed = group.stop(SIGTERM, 0.5, watcher, signals, [&] { ++ticks; }, milliseconds(100));
  auto took = Clock::now() - start;
  group.finish(milliseconds(200));
  EXPECT_EQ(killed, std::vector<int>{0});  // only the one that ignored SIGTERM
  EXPECT_GE(took, milliseconds(450));
  EXPECT_LT(took, milliseconds(5000));
  EXPECT_GE(ticks, 2);
  EXPECT_TRUE(group.all_exited());
  // The background child of rank 2 went with its process group.
  for (int i = 0; i < 50 && process_exists(child2); ++i) ::usleep(20000);
  EXPECT_FALSE(process_exists(child2));
  std::filesystem::remove_all(out.log_dir);
}

TEST(LaunchProcess, SignalWatcherReportsTerminatingSignals) {
  SignalWatcher watcher;
  ::raise(SIGTERM);
  std::vector<int> got = watcher.take();
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0], SIGTERM);
  EXPECT_TRUE(watcher.take().empty());
}

}  // namespace
}  // namespace tessera::launch
