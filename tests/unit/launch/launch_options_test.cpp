// `tessera launch` flags: torchrun's spellings, defaults, errors; program resolution.
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>
#include <vector>

#include "tessera/core/error.h"
#include "tessera/launch/launch_options.h"
#include "tessera/launch/launcher.h"

namespace tessera::launch {
namespace {

LaunchOptions parse(std::vector<std::string> args) {
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  return parse_launch_options(static_cast<int>(argv.size()), argv.data());
}

std::string error_of(std::vector<std::string> args) {
  try {
    parse(std::move(args));
  } catch (const Error& e) {
    EXPECT_EQ(e.exit_code(), 2);
    return e.what();
  }
  return "no error";
}

class LaunchOptionsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ::unsetenv("MASTER_ADDR");
    ::unsetenv("MASTER_PORT");
  }
};

TEST_F(LaunchOptionsTest, TorchrunDefaults) {
  LaunchOptions o = parse({"prog"});
  EXPECT_EQ(o.nproc_per_node, 1);
  EXPECT_EQ(o.nnodes, 1);
  EXPECT_EQ(o.node_rank, 0);
  EXPECT_EQ(o.master_addr, "127.0.0.1");
  EXPECT_EQ(o.master_port, 29500);
  EXPECT_EQ(o.join_timeout_s, 600);
  EXPECT_EQ(o.max_restarts, 0);
  EXPECT_EQ(o.signal_grace_s, 30);
  EXPECT_EQ(o.program, std::vector<std::string>{"prog"});
}

TEST_F(LaunchOptionsTest, DashUnderscoreEqualsAndPrefixSpellings) {
  for (auto args : std::vector<std::vector<std::string>>{
           {"--nproc_per_node", "4", "--node_rank", "1", "--nnodes", "2", "p"},
           {"--nproc-per-node=4", "--node-rank=1", "--nnodes=2", "p"},
           {"--nproc", "4", "--node_r", "1", "--nnodes", "2:2", "p"}}) {
    LaunchOptions o = parse(args);
    EXPECT_EQ(o.nproc_per_node, 4);
    EXPECT_EQ(o.node_rank, 1);
    EXPECT_EQ(o.nnodes, 2);
  }
  EXPECT_NE(error_of({"--ma", "x", "p"}).find("ambiguous"), std::string::npos);  // --master-*, --max-restarts
}

TEST_F(LaunchOptionsTest, EverythingAfterTheProgramBelongsToIt) {
  LaunchOptions o = parse({"--nproc_per_node", "2", "tessera", "train", "--nproc_per_node", "9", "--lr", "1"});
  EXPECT_EQ(o.nproc_per_node, 2);
  EXPECT_EQ(o.program, (std::vector<std::string>{"tessera", "train", "--nproc_per_node", "9", "--lr", "1"}));
  o = parse({"--", "--weird-program-name"});
  EXPECT_EQ(o.program, std::vector<std::string>{"--weird-program-name"});
}

TEST_F(LaunchOptionsTest, EnvironmentDefaultsAndFlagsOverride) {
  ::setenv("MASTER_ADDR", "10.0.0.9", 1);
  ::setenv("MASTER_PORT", "6000", 1);
  LaunchOptions o = parse({"p"});
  EXPECT_EQ(o.master_addr, "10.0.0.9");
  EXPECT_EQ(o.master_port, 6000);
  o = parse({"--master_addr", "h", "--master_port", "7000", "p"});
  EXPECT_EQ(store_endpoint(o).host, "h");
  EXPECT_EQ(store_endpoint(o).port, 7000);
  ::unsetenv("MASTER_ADDR");
  ::unsetenv("MASTER_PORT");
}

TEST_F(LaunchOptionsTest, Rendezvous) {
  LaunchOptions o = parse({"--rdzv_backend", "c10d", "--rdzv_endpoint", "node0:1234", "--rdzv_id", "j1", "--nnodes",
                           "3", "--rdzv_conf", "join_timeout=30,keep_alive_interval=2,is_host=false", "p"});
  EXPECT_FALSE(o.node_rank.has_value());  // c10d hands out node ranks
  EXPECT_EQ(store_endpoint(o).host, "node0");
  EXPECT_EQ(store_endpoint(o).port, 1234);
  EXPECT_EQ(o.join_timeout_s, 30);
  EXPECT_EQ(o.keep_alive_interval_s, 2);
  EXPECT_EQ(o.is_host, false);
  EXPECT_EQ(store_endpoint(parse({"--rdzv_endpoint", "node0", "p"})).port, 29400);
  EXPECT_EQ(store_endpoint(parse({"--rdzv_endpoint", "[::1]:5", "p"})).host, "::1");
  o = parse({"--standalone", "p"});
  EXPECT_EQ(store_endpoint(o).host, "127.0.0.1");
  EXPECT_EQ(store_endpoint(o).port, 0);
  EXPECT_EQ(o.node_rank, 0);
}

TEST_F(LaunchOptionsTest, OutputAndGrace) {
  LaunchOptions o = parse({"--log-dir", "d", "-r", "3", "--tee", "1", "--local-ranks-filter", "0,2", "--prefix",
                           "never", "--signal-grace-seconds", "1.5", "--failure-grace-seconds", "0", "p"});
  EXPECT_EQ(o.redirects, 3);
  EXPECT_EQ(o.tee, 1);
  EXPECT_EQ(o.local_ranks_filter, (std::set<int>{0, 2}));
  EXPECT_EQ(o.prefix, PrefixMode::Never);
  EXPECT_EQ(o.signal_grace_s, 1.5);
  EXPECT_EQ(o.failure_grace_s, 0);
}

TEST_F(LaunchOptionsTest, Errors) {
  EXPECT_NE(error_of({}).find("no program"), std::string::npos);
  EXPECT_NE(error_of({"--bogus", "p"}).find("unknown flag --bogus"), std::string::npos);
  EXPECT_NE(error_of({"--nnodes", "2", "--node_rank", "2", "p"}).find("--node_rank 2"), std::string::npos);
  EXPECT_NE(error_of({"--nnodes", "1:4", "p"}).find("elastic"), std::string::npos);
  EXPECT_NE(error_of({"--nproc_per_node", "0", "p"}).find("--nproc-per-node"), std::string::npos);
  EXPECT_NE(error_of({"--nproc_per_node"}).find("expects a value"), std::string::npos);
  EXPECT_NE(error_of({"--standalone", "--nnodes", "2", "p"}).find("--standalone"), std::string::npos);
  EXPECT_NE(error_of({"--rdzv_backend", "etcd", "p"}).find("etcd"), std::string::npos);
  EXPECT_NE(error_of({"--rdzv_conf", "join_timeout", "p"}).find("key=value"), std::string::npos);
  EXPECT_NE(error_of({"--redirects", "3", "p"}).find("--log-dir"), std::string::npos);
  EXPECT_NE(error_of({"--standalone=1", "p"}).find("takes no value"), std::string::npos);
  EXPECT_NE(error_of({"--nnodes", "2", "--master_port", "0", "p"}).find("port 0"), std::string::npos);
}

TEST_F(LaunchOptionsTest, ProgramResolution) {
  const std::vector<std::string> subs = {"train", "data"};
  Program p = resolve_program(parse({"tessera", "train", "--lr", "1"}), "/x/tessera", subs);
  EXPECT_EQ(p.path, "/x/tessera");
  EXPECT_EQ(p.argv, (std::vector<std::string>{"tessera", "train", "--lr", "1"}));
  p = resolve_program(parse({"train", "--lr", "1"}), "/x/tessera", subs);
  EXPECT_EQ(p.argv, (std::vector<std::string>{"tessera", "train", "--lr", "1"}));
  p = resolve_program(parse({"some/dir/pretrain_gpt.py", "--lr", "1"}), "/x/tessera", subs);
  EXPECT_EQ(p.argv, (std::vector<std::string>{"tessera", "train", "--lr", "1"}));
  EXPECT_FALSE(p.note.empty());
  p = resolve_program(parse({"sh", "-c", "true"}), "/x/tessera", subs);
  EXPECT_EQ(p.argv[0], "sh");
  EXPECT_NE(p.path.find("/sh"), std::string::npos);
  p = resolve_program(parse({"script.py", "a"}), "/x/tessera", subs);
  EXPECT_NE(p.path.find("python"), std::string::npos);
  EXPECT_EQ(p.argv[1], "script.py");
  p = resolve_program(parse({"-m", "mod", "a"}), "/x/tessera", subs);
  EXPECT_EQ((std::vector<std::string>(p.argv.begin() + 1, p.argv.end())), (std::vector<std::string>{"-m", "mod", "a"}));
  EXPECT_THROW(resolve_program(parse({"no-such-program-anywhere"}), "/x/tessera", subs), Error);
  EXPECT_THROW(resolve_program(parse({"--no-python", "./nothing.py"}), "/x/tessera", subs), Error);
}

}  // namespace
}  // namespace tessera::launch
