// open_job_store (launch/job_store.h): under torchrun's variables rank 0 serves tessera's
// store on MASTER_PORT + 1 and rank 1 reaches it with the derived token; one process gets
// an in-process store.
#include <gtest/gtest.h>

#include <chrono>
#include <future>
#include <map>
#include <string>

#include "tessera/launch/job_store.h"
#include "../test_ports.h"

namespace tessera::launch {
namespace {

using std::chrono::milliseconds;

WorkerIdentity torchrun_rank(int rank, int master_port) {
  std::map<std::string, std::string> env = {{"RANK", std::to_string(rank)},
                                            {"WORLD_SIZE", "2"},
                                            {"LOCAL_RANK", std::to_string(rank)},
                                            {"MASTER_ADDR", "127.0.0.1"},
                                            {"MASTER_PORT", std::to_string(master_port)},
                                            {"TORCHELASTIC_RUN_ID", "jobstoretest"}};
  return from_environment(0, nullptr, [env](const char* name) -> const char* {
    auto it = env.find(name);
    return it == env.end() ? nullptr : it->second.c_str();
  });
}

TEST(LaunchJobStore, RankZeroServesUnderTorchrun) {
  const int master_port = test_ports::claim(2);  // rank 0 serves the store on MASTER_PORT + 1
  WorkerIdentity r0 = torchrun_rank(0, master_port), r1 = torchrun_rank(1, master_port);
  ASSERT_TRUE(r0.serve_store);
  ASSERT_FALSE(r1.serve_store);
  auto rank1 = std::async(std::launch::async, [&] {
    JobStore js = open_job_store(r1, milliseconds(20000));
    js.store->set(r1.key_prefix + "from1", {1, 2, 3});
    return js.store->get(r1.key_prefix + "from0");
  });
  JobStore js0 = open_job_store(r0, milliseconds(20000));
  ASSERT_NE(js0.server, nullptr);
  EXPECT_EQ(js0.server->port(), master_port + 1);
  js0.store->set(r0.key_prefix + "from0", {9});
  EXPECT_EQ(js0.store->get(r0.key_prefix + "from1"), (std::vector<uint8_t>{1, 2, 3}));
  EXPECT_EQ(rank1.get(), std::vector<uint8_t>{9});
}

TEST(LaunchJobStore, OneProcessGetsAnInProcessStore) {
  JobStore js = open_job_store(WorkerIdentity{}, milliseconds(1000));
  EXPECT_EQ(js.server, nullptr);
  js.store->set("k", {7});
  EXPECT_EQ(js.store->add("n", 2), 2);
}

}  // namespace
}  // namespace tessera::launch
