// The TCP rendezvous store: set/get/add/check/wait between clients, waits that time out with
// the keys and the address in the message, job tokens that keep other jobs out (an error on
// both sides), unreachable and busy ports, many concurrent clients, a server that survives
// garbage, the default job token rule, and a native library's unique-id blob (HCCL's 4,108-byte
// root info, NCCL's 128 bytes) shared by its root through the store. Every test finishes in well under 10 s: timeouts
// here are a few hundred milliseconds.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <thread>

#include "tessera/comm/store.h"
#include "tessera/comm/unique_id.h"
#include "tessera/core/error.h"
#include "../test_ports.h"

using namespace tessera;
using namespace std::chrono_literals;

namespace {

std::vector<uint8_t> bytes(const std::string& s) { return {s.begin(), s.end()}; }
std::string text(const std::vector<uint8_t>& v) { return {v.begin(), v.end()}; }


// Expects `f` to throw a tessera::Error and returns "what\nhint".
template <typename F>
std::string error_of(F f) {
  try {
    f();
  } catch (const Error& e) {
    return std::string(e.what()) + "\n" + e.hint();
  }
  ADD_FAILURE() << "no tessera::Error thrown";
  return "";
}

}  // namespace

TEST(Store, SetGetAddCheckAcrossClients) {
  TcpStoreServer server(0, "job-1");
  ASSERT_GT(server.port(), 0);
  auto a = connect_tcp_store("127.0.0.1", server.port(), "job-1", 2s);
  auto b = connect_tcp_store("localhost", server.port(), "job-1", 2s);
  a->set("k", bytes("value"));
  EXPECT_EQ(text(b->get("k")), "value");
  // Values are bytes: zeros and a large one survive.
  std::vector<uint8_t> big(4 << 20);
  for (size_t i = 0; i < big.size(); ++i) big[i] = static_cast<uint8_t>(i * 7);
  big[0] = 0;
  a->set("big", big);
  EXPECT_EQ(b->get("big"), big);
  a->set("empty", {});
  EXPECT_TRUE(b->get("empty").empty());

  EXPECT_EQ(a->add("n", 5), 5);
  EXPECT_EQ(b->add("n", -2), 3);
  EXPECT_EQ(text(a->get("n")), "3");  // counters read as decimal text
  EXPECT_TRUE(a->check({"k", "n"}));
  EXPECT_FALSE(a->check({"k", "absent"}));
  a->wait({"k", "n"}, 100ms);
  EXPECT_EQ(a->timeout(), 2s);
  // add on a key that holds text is refused, naming the key
  EXPECT_NE(error_of([&] { a->add("k", 1); }).find("'k'"), std::string::npos);
}

TEST(Store, GetWaitsForAKeySetLater) {
  TcpStoreServer server(0, "t");
  auto waiter = connect_tcp_store("127.0.0.1", server.port(), "t", 5s);
  std::thread setter([port = server.port()] {
    auto s = connect_tcp_store("127.0.0.1", port, "t", 5s);
    std::this_thread::sleep_for(100ms);
    s->set("late", bytes("here"));
  });
  EXPECT_EQ(text(waiter->get("late")), "here");
  setter.join();
}

TEST(Store, WaitTimeoutNamesMissingKeysAndAddress) {
  TcpStoreServer server(0, "t");
  auto s = connect_tcp_store("127.0.0.1", server.port(), "t", 300ms);
  s->set("present", bytes("1"));
  const std::string where = "127.0.0.1:" + std::to_string(server.port());
  auto t0 = std::chrono::steady_clock::now();
  std::string e = error_of([&] { s->wait({"present", "rank3/addr"}, 250ms); });
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 3s);
  EXPECT_NE(e.find("timed out after 0.25 s"), std::string::npos) << e;
  EXPECT_NE(e.find("'rank3/addr'"), std::string::npos) << e;
  EXPECT_EQ(e.find("'present'"), std::string::npos) << e;
  EXPECT_NE(e.find(where), std::string::npos) << e;
  // get uses the store's timeout
  e = error_of([&] { s->get("never"); });
  EXPECT_NE(e.find("'never'"), std::string::npos) << e;
  EXPECT_NE(e.find(where), std::string::npos) << e;
  // the connection stays usable after a timeout
  EXPECT_EQ(text(s->get("present")), "1");
}

TEST(Store, TokenMismatchIsRejectedOnBothSides) {
  TcpStoreServer server(0, "job-A");
  testing::internal::CaptureStderr();
  std::string e = error_of([&] { connect_tcp_store("127.0.0.1", server.port(), "job-B", 2s); });
  // The server logs the rejection before it replies, so the line is there once the client
  // has the refusal.
  std::string server_log = testing::internal::GetCapturedStderr();
  EXPECT_NE(e.find("127.0.0.1:" + std::to_string(server.port())), std::string::npos) << e;
  EXPECT_NE(e.find("job token mismatch"), std::string::npos) << e;
  EXPECT_NE(e.find("TESSERA_JOB_TOKEN"), std::string::npos) << e;  // the hint says what to align
  EXPECT_NE(server_log.find("rejected a connection from 127.0.0.1:"), std::string::npos) << server_log;
  EXPECT_NE(server_log.find("job token mismatch"), std::string::npos) << server_log;
  // the right token still gets in
  auto ok = connect_tcp_store("127.0.0.1", server.port(), "job-A", 2s);
  ok->set("x", bytes("y"));
}

TEST(Store, UnreachableStoreTimesOutWithAddressAndWhatToCheck) {
  const int port = test_ports::claim();  // nobody listens on it until this test does
  auto t0 = std::chrono::steady_clock::now();
  std::string e = error_of([&] { connect_tcp_store("127.0.0.1", port, "t", 400ms); });
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 3s);
  EXPECT_NE(e.find("127.0.0.1:" + std::to_string(port)), std::string::npos) << e;
  EXPECT_NE(e.find("Connection refused"), std::string::npos) << e;
  EXPECT_NE(e.find("firewall"), std::string::npos) << e;
  EXPECT_NE(e.find("MASTER_ADDR"), std::string::npos) << e;
  // an unknown host name is a usage error naming it
  e = error_of([&] { connect_tcp_store("no-such-host.invalid", port, "t", 400ms); });
  EXPECT_NE(e.find("no-such-host.invalid"), std::string::npos) << e;
}

TEST(Store, ConnectRetriesUntilTheServerStarts) {
  const int port = test_ports::claim();  // nobody listens on it until this test does
  std::unique_ptr<TcpStoreServer> server;
  std::thread starter([&] {
    std::this_thread::sleep_for(300ms);
    server = std::make_unique<TcpStoreServer>(port, "t");
  });
  auto s = connect_tcp_store("127.0.0.1", port, "t", 5s);
  starter.join();
  s->set("a", bytes("b"));
  EXPECT_EQ(text(s->get("a")), "b");
}

TEST(Store, PortInUseSaysSo) {
  TcpStoreServer first(0, "t");
  std::string e = error_of([&] { TcpStoreServer second(first.port(), "t"); });
  EXPECT_NE(e.find("port " + std::to_string(first.port())), std::string::npos) << e;
  EXPECT_NE(e.find("in use"), std::string::npos) << e;
  EXPECT_NE(e.find("--master_port"), std::string::npos) << e;
  EXPECT_NE(e.find("--standalone"), std::string::npos) << e;  // one node: let the launcher pick
}

TEST(Store, ManyClientsAddAndWaitForEachOther) {
  TcpStoreServer server(0, "t");
  constexpr int kClients = 48, kAdds = 20;
  std::vector<std::thread> threads;
  std::atomic<int> failures{0};
  for (int c = 0; c < kClients; ++c)
    threads.emplace_back([&, c] {
      try {
        auto s = connect_tcp_store("127.0.0.1", server.port(), "t", 10s);
        for (int i = 0; i < kAdds; ++i) s->add("counter", 1);
        s->set("done/" + std::to_string(c), bytes("1"));
        std::vector<std::string> all;
        for (int k = 0; k < kClients; ++k) all.push_back("done/" + std::to_string(k));
        s->wait(all, 10s);
      } catch (const std::exception& e) {
        ++failures;
        ADD_FAILURE() << e.what();
      }
    });
  for (auto& t : threads) t.join();
  EXPECT_EQ(failures.load(), 0);
  auto s = connect_tcp_store("127.0.0.1", server.port(), "t", 2s);
  EXPECT_EQ(s->add("counter", 0), kClients * kAdds);
}

TEST(Store, ServerSurvivesGarbageAndStrayClients) {
  TcpStoreServer server(0, "t");
  testing::internal::CaptureStderr();
  for (const std::string& junk : {std::string("GET / HTTP/1.1\r\n\r\n"), std::string("\xff\xff\xff\xff", 4)}) {
    int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = htons(static_cast<uint16_t>(server.port()));
    ASSERT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
    ASSERT_EQ(::send(fd, junk.data(), junk.size(), 0), static_cast<ssize_t>(junk.size()));
    char c;
    ::recv(fd, &c, 1, 0);  // the server closes it
    ::close(fd);
  }
  testing::internal::GetCapturedStderr();
  auto s = connect_tcp_store("127.0.0.1", server.port(), "t", 2s);
  s->set("still", bytes("here"));
  EXPECT_EQ(text(s->get("still")), "here");
}

TEST(Store, ShutdownWakesAWaitingClient) {
  auto server = std::make_unique<TcpStoreServer>(0, "t");
  auto s = connect_tcp_store("127.0.0.1", server->port(), "t", 30s);
  std::thread stopper([&] {
    std::this_thread::sleep_for(200ms);
    server.reset();
  });
  auto t0 = std::chrono::steady_clock::now();
  std::string e = error_of([&] { s->get("never"); });
  stopper.join();
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 5s);
  EXPECT_TRUE(e.find("shutting down") != std::string::npos || e.find("lost") != std::string::npos) << e;
}

TEST(Store, LocalStoreHasTheSameSemantics) {
  auto s = make_local_store(200ms);
  std::thread setter([&] {
    std::this_thread::sleep_for(50ms);
    s->set("k", bytes("v"));
  });
  EXPECT_EQ(text(s->get("k")), "v");
  setter.join();
  EXPECT_EQ(s->add("c", 2), 2);
  EXPECT_TRUE(s->check({"k", "c"}));
  std::string e = error_of([&] { s->wait({"k", "gone"}, 50ms); });
  EXPECT_NE(e.find("'gone'"), std::string::npos) << e;
}

TEST(Store, DefaultJobTokenRule) {
  const char* names[] = {"TESSERA_JOB_TOKEN", "TORCHELASTIC_RUN_ID", "SLURM_JOB_ID", "SLURM_STEP_ID",
                         "TESSERA_STORE_PORT", "MASTER_PORT"};
  std::vector<std::pair<std::string, std::string>> saved;
  for (const char* n : names) {
    if (const char* v = std::getenv(n)) saved.emplace_back(n, v);
    ::unsetenv(n);
  }
  EXPECT_EQ(default_job_token(), "tessera-job:none:0");
  ::setenv("MASTER_PORT", "29500", 1);
  EXPECT_EQ(default_job_token(), "tessera-job:none:29501");
  ::setenv("SLURM_JOB_ID", "123", 1);
  ::setenv("SLURM_STEP_ID", "4", 1);
  EXPECT_EQ(default_job_token(), "tessera-job:123.4:29501");
  ::setenv("TORCHELASTIC_RUN_ID", "exp7", 1);
  ::setenv("TESSERA_STORE_PORT", "31000", 1);
  EXPECT_EQ(default_job_token(), "tessera-job:exp7:31000");
  ::setenv("TESSERA_JOB_TOKEN", "explicit", 1);
  EXPECT_EQ(default_job_token(), "explicit");
  for (const char* n : names) ::unsetenv(n);
  for (const auto& [n, v] : saved) ::setenv(n.c_str(), v.c_str(), 1);
}

// HcclGetRootInfo's blob is 4,108 bytes, ncclGetUniqueId's 128: both reach every rank bytes
// unchanged, zeros included, whichever rank gets there first.
TEST(Store, UniqueIdBlobOfAnySizeReachesEveryRank) {
  TcpStoreServer server(0, "job-id");
  for (size_t size : {size_t(4108), size_t(128)}) {
    std::vector<uint8_t> blob(size);
    for (size_t i = 0; i < size; ++i) blob[i] = static_cast<uint8_t>(i * 31 + 7);
    blob[0] = blob[size - 1] = 0;
    const std::string key = "job/hccl/world/" + std::to_string(size);
    constexpr int kRanks = 4;
    std::vector<std::vector<uint8_t>> got(kRanks);
    std::vector<std::thread> ranks;
    for (int r = kRanks - 1; r >= 0; --r)  // the root starts last: the others wait for it
      ranks.emplace_back([&, r] {
        auto store = connect_tcp_store("127.0.0.1", server.port(), "job-id", 2s);
        got[r] = share_unique_id(*store, key, r == 0, [&] { return blob; }, 2s);
      });
    for (auto& t : ranks) t.join();
    for (int r = 0; r < kRanks; ++r) EXPECT_EQ(got[r], blob) << "rank " << r << ", " << size << " bytes";
  }
}

TEST(Store, UniqueIdThatNeverArrivesNamesTheKey) {
  TcpStoreServer server(0, "job-id");
  auto store = connect_tcp_store("127.0.0.1", server.port(), "job-id", 2s);
  const std::string e = error_of([&] { share_unique_id(*store, "job/nccl/tp", false, {}, 200ms); });
  EXPECT_NE(e.find("unique id 'job/nccl/tp' never arrived from its root rank"), std::string::npos) << e;
}
