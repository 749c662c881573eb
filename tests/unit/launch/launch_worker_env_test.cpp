// The worker-side environment contract (launch/worker_env.h): what each launcher sets, read
// back by from_environment; the launcher's own variables round-trip.
#include <gtest/gtest.h>

#include <map>
#include <string>
#include <vector>

#include "tessera/core/error.h"
#include "tessera/launch/worker_env.h"

namespace tessera::launch {
namespace {

struct FakeEnv {
  std::map<std::string, std::string> vars;
  EnvLookup lookup() const {
    return [this](const char* name) -> const char* {
      auto it = vars.find(name);
      return it == vars.end() ? nullptr : it->second.c_str();
    };
  }
};

WorkerIdentity read(const FakeEnv& env, std::vector<std::string> args = {}) {
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  return from_environment(static_cast<int>(argv.size()), argv.data(), env.lookup());
}

TEST(LaunchWorkerEnv, NothingSetIsOneProcess) {
  WorkerIdentity id = read({});
  EXPECT_EQ(id.launcher, LauncherKind::None);
  EXPECT_EQ(id.rank, 0);
  EXPECT_EQ(id.world_size, 1);
  EXPECT_FALSE(id.distributed());
  EXPECT_FALSE(id.serve_store);
  EXPECT_EQ(id.run_id, "none");
}

TEST(LaunchWorkerEnv, TesseraLauncherRoundTrip) {
  WorkerSlot slot;
  slot.rank = 5;
  slot.local_rank = 1;
  slot.world_size = 8;
  slot.local_world_size = 2;
  slot.node_rank = 2;
  slot.num_nodes = 4;
  slot.master_addr = "10.0.0.1";
  slot.master_port = 29500;
  slot.run_id = "job7";
  slot.job_token = "secret";
  slot.restart_count = 3;
  slot.max_restarts = 5;
  slot.set_omp_num_threads = true;
  FakeEnv env;
  env.vars = worker_variables(slot);
  EXPECT_EQ(env.vars.at("OMP_NUM_THREADS"), "1");
  EXPECT_EQ(env.vars.at("ROLE_RANK"), "5");
  EXPECT_EQ(env.vars.at("TORCHELASTIC_MAX_RESTARTS"), "5");
  WorkerIdentity id = read(env);
  EXPECT_EQ(id.launcher, LauncherKind::Tessera);
  EXPECT_EQ(id.rank, 5);
  EXPECT_EQ(id.local_rank, 1);
  EXPECT_EQ(id.world_size, 8);
  EXPECT_EQ(id.local_world_size, 2);
  EXPECT_EQ(id.node_rank, 2);
  EXPECT_EQ(id.num_nodes, 4);
  EXPECT_EQ(id.store_host, "10.0.0.1");
  EXPECT_EQ(id.store_port, 29500);  // the launcher serves it on MASTER_PORT itself
  EXPECT_FALSE(id.serve_store);
  EXPECT_EQ(id.job_token, "secret");
  EXPECT_EQ(id.restart_count, 3);
  EXPECT_EQ(id.key_prefix, "run/job7/attempt/3/");
  EXPECT_NE(id.describe().find("rank 5 of 8"), std::string::npos);
}

TEST(LaunchWorkerEnv, TesseraLauncherWithMissingVariableIsAnError) {
  WorkerSlot slot;
  slot.master_addr = "h";
  slot.master_port = 1;
  FakeEnv env;
  env.vars = worker_variables(slot);
  env.vars.erase("LOCAL_WORLD_SIZE");
  try {
    read(env);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("LOCAL_WORLD_SIZE"), std::string::npos) << e.what();
  }
}

TEST(LaunchWorkerEnv, TorchrunServesTheStoreOnRankZeroAtMasterPortPlusOne) {
  FakeEnv env;
  env.vars = {{"RANK", "0"},          {"WORLD_SIZE", "4"},       {"LOCAL_RANK", "0"},
              {"LOCAL_WORLD_SIZE", "2"}, {"GROUP_RANK", "0"},     {"MASTER_ADDR", "node0"},
              {"MASTER_PORT", "29500"}, {"TORCHELASTIC_RUN_ID", "abc"}};
  WorkerIdentity id = read(env);
  EXPECT_EQ(id.launcher, LauncherKind::Torchrun);
  EXPECT_EQ(id.store_host, "node0");
  EXPECT_EQ(id.store_port, 29501);
  EXPECT_TRUE(id.serve_store);
  EXPECT_EQ(id.job_token, derived_job_token("abc", 29501));
  EXPECT_EQ(id.job_token, "tessera-job:abc:29501");  // the rule comm's default_job_token() repeats

  env.vars["RANK"] = "3";
  env.vars["LOCAL_RANK"] = "1";
  env.vars["TESSERA_STORE_PORT"] = "40000";
  id = read(env);
  EXPECT_FALSE(id.serve_store);
  EXPECT_EQ(id.store_port, 40000);
}

TEST(LaunchWorkerEnv, OldLaunchPassesLocalRankInArgv) {
  FakeEnv env;
  env.vars = {{"RANK", "1"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "127.0.0.1"}, {"MASTER_PORT", "6000"}};
  EXPECT_EQ(read(env, {"--local-rank=1"}).local_rank, 1);
  EXPECT_EQ(read(env, {"--foo", "--local_rank", "1"}).local_rank, 1);
  EXPECT_EQ(read(env, {"--local-rank", "1"}).local_world_size, 0);  // not told
  env.vars["LOCAL_RANK"] = "0";
  EXPECT_THROW(read(env, {"--local-rank=1"}), Error);  // contradicts LOCAL_RANK
  EXPECT_THROW(read(env, {"--local-rank=x"}), Error);
}

TEST(LaunchWorkerEnv, ErrorsNameTheVariable) {
  auto message = [](FakeEnv env) {
    try {
      read(env);
    } catch (const Error& e) {
      return std::string(e.what()) + " | " + e.hint();
    }
    return std::string("no error");
  };
  EXPECT_NE(message({{{"RANK", "1"}}}).find("WORLD_SIZE"), std::string::npos);
  EXPECT_NE(message({{{"RANK", "2"}, {"WORLD_SIZE", "2"}}}).find("RANK=2"), std::string::npos);
  EXPECT_NE(message({{{"RANK", "x"}, {"WORLD_SIZE", "2"}}}).find("RANK='x'"), std::string::npos);
  EXPECT_NE(message({{{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_PORT", "1"}}}).find("MASTER_ADDR"),
            std::string::npos);
  EXPECT_NE(message({{{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "h"}}}).find("MASTER_PORT"),
            std::string::npos);
  EXPECT_NE(message({{{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "h"}, {"MASTER_PORT", "70000"}}})
                .find("MASTER_PORT=70000"),
            std::string::npos);
  // A single process needs no store, so nothing more is required.
  EXPECT_EQ(message({{{"RANK", "0"}, {"WORLD_SIZE", "1"}}}), "no error");
}

TEST(LaunchWorkerEnv, Slurm) {
  FakeEnv env;
  env.vars = {{"SLURM_PROCID", "5"},         {"SLURM_NTASKS", "6"},
              {"SLURM_LOCALID", "1"},        {"SLURM_NODEID", "2"},
              {"SLURM_NNODES", "3"},         {"SLURM_STEP_TASKS_PER_NODE", "2(x3)"},
              {"SLURM_JOB_ID", "4242"},      {"SLURM_STEP_ID", "0"},
              {"SLURM_JOB_NODELIST", "gpu[07-09]"}};
  WorkerIdentity id = read(env);
  EXPECT_EQ(id.launcher, LauncherKind::Slurm);
  EXPECT_EQ(id.rank, 5);
  EXPECT_EQ(id.world_size, 6);
  EXPECT_EQ(id.local_rank, 1);
  EXPECT_EQ(id.local_world_size, 2);
  EXPECT_EQ(id.node_rank, 2);
  EXPECT_EQ(id.num_nodes, 3);
  EXPECT_EQ(id.master_addr, "gpu07");
  EXPECT_EQ(id.master_port, 29500);
  EXPECT_EQ(id.store_port, 29501);
  EXPECT_EQ(id.run_id, "4242.0");
  EXPECT_FALSE(id.serve_store);
  env.vars["MASTER_ADDR"] = "10.1.1.1";
  env.vars["MASTER_PORT"] = "6000";
  id = read(env);
  EXPECT_EQ(id.master_addr, "10.1.1.1");
  EXPECT_EQ(id.store_port, 6001);
  // torchrun inside an allocation: its variables win over Slurm's.
  env.vars["RANK"] = "0";
  env.vars["WORLD_SIZE"] = "2";
  EXPECT_EQ(read(env).launcher, LauncherKind::Torchrun);
}

TEST(LaunchWorkerEnv, SlurmHelpers) {
  EXPECT_EQ(slurm_tasks_on_node("2(x3),1", 0), 2);
  EXPECT_EQ(slurm_tasks_on_node("2(x3),1", 2), 2);
  EXPECT_EQ(slurm_tasks_on_node("2(x3),1", 3), 1);
  EXPECT_EQ(slurm_tasks_on_node("2(x3),1", 4), 0);
  EXPECT_EQ(slurm_tasks_on_node("8", 0), 8);
  EXPECT_EQ(slurm_tasks_on_node("2(x", 0), 0);
  EXPECT_EQ(slurm_first_host("gpu[07-09,12],cpu1"), "gpu07");
  EXPECT_EQ(slurm_first_host("a1,b2"), "a1");
  EXPECT_EQ(slurm_first_host("node[3,5]-ib"), "node3-ib");
  EXPECT_EQ(slurm_first_host("solo"), "solo");
}

}  // namespace
}  // namespace tessera::launch
