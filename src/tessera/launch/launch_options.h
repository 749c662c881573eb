// `tessera launch` flags: torchrun's interface (every multi-word flag in its dash and
// underscore spelling, unique prefixes as argparse allows, `--flag=value`), plus tessera's
// grace periods and output prefix. One table (launch_options.cpp) drives parsing and --help.
#pragma once

#include <optional>
#include <set>
#include <string>
#include <vector>

namespace tessera::launch {

enum class PrefixMode { Auto, Always, Never };

struct LaunchOptions {
  // Processes per node and nodes.
  int nproc_per_node = 1;
  int nnodes = 1;
  std::optional<int> node_rank;  // nullopt: not given (0 for the static backend)
  // Rendezvous.
  std::string master_addr = "127.0.0.1";  // MASTER_ADDR from the environment when set
  int master_port = 29500;                // MASTER_PORT from the environment when set
  bool standalone = false;
  std::string rdzv_backend = "static";    // static | c10d (both served by tessera's store)
  std::string rdzv_endpoint;              // host[:port]; "" when not given
  std::string rdzv_id = "none";
  double join_timeout_s = 600;            // --rdzv_conf join_timeout=
  double keep_alive_interval_s = 5;       // --rdzv_conf keep_alive_interval=
  int keep_alive_max_attempt = 3;         // --rdzv_conf keep_alive_max_attempt=
  std::optional<bool> is_host;            // --rdzv_conf is_host=
  std::string local_addr;                 // --local-addr: this node's name in messages
  // Restarts and supervision.
  int max_restarts = 0;
  double monitor_interval_s = 0.1;
  double signal_grace_s = 30;   // after SIGINT/SIGTERM/SIGHUP/SIGQUIT, before SIGKILL
  double failure_grace_s = 3;   // after another worker failed, before SIGKILL
  // Output.
  std::string log_dir;
  int redirects = 0;  // bit 1: stdout, bit 2: stderr only to --log-dir files
  int tee = 0;        // accepted (with --log-dir, files and console is the default)
  PrefixMode prefix = PrefixMode::Auto;
  std::set<int> local_ranks_filter;  // console shows only these local ranks; empty: all
  std::string role = "default";
  // Program.
  bool no_python = false;  // --no-python: run a .py program as an executable
  bool module = false;     // -m: the program is a Python module (python3 -m)
  std::vector<std::string> program;  // as given: program and its arguments
  bool help = false;
};

// Parses argv (without "launch"); throws tessera::Error (usage) naming the flag.
// `env` supplies MASTER_ADDR/MASTER_PORT defaults (nullptr: the process environment).
LaunchOptions parse_launch_options(int argc, char** argv);
void print_launch_help();

// The store endpoint the options name: --rdzv_endpoint when given, else
// --master_addr:--master_port (a port 0 is chosen by the node that serves).
struct Endpoint {
  std::string host;
  int port = 0;
};
Endpoint store_endpoint(const LaunchOptions& o);

// Number of NVIDIA GPUs this process may use (/proc/driver/nvidia/gpus, CUDA_VISIBLE_DEVICES).
int visible_gpu_count();

}  // namespace tessera::launch
