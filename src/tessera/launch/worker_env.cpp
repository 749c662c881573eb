#include "tessera/launch/worker_env.h"

#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>

#include "tessera/core/error.h"

namespace tessera::launch {
namespace {

const char* kLaunchHint = "see docs/distributed.md, \"tessera launch\", for the variables each launcher sets";

std::optional<std::string> lookup(const EnvLookup& env, const char* name) {
  const char* v = env(name);
  if (!v || !*v) return std::nullopt;
  return std::string(v);
}

int parse_int(const std::string& what, const std::string& text) {
  errno = 0;
  char* end = nullptr;
  long v = std::strtol(text.c_str(), &end, 10);
  if (text.empty() || *end != '\0' || errno == ERANGE || v < INT_MIN || v > INT_MAX)
    throw usage_error(what + "='" + text + "' is not an integer", kLaunchHint);
  return static_cast<int>(v);
}

std::optional<int> int_var(const EnvLookup& env, const char* name) {
  auto v = lookup(env, name);
  if (!v) return std::nullopt;
  return parse_int(name, *v);
}

int required_int(const EnvLookup& env, const char* name, const char* context) {
  auto v = int_var(env, name);
  if (!v)
    throw usage_error(std::string(context) + " but " + name + " is not",
                      "start the program through `tessera launch`, torchrun or srun, or set every "
                      "variable of the launcher's contract; " + std::string(kLaunchHint));
  return *v;
}

// --local-rank N, --local-rank=N, --local_rank N, --local_rank=N (torch.distributed.launch).
std::optional<int> local_rank_from_argv(int argc, char** argv) {
  for (int i = 0; i < argc; ++i) {
    std::string a = argv[i] ? argv[i] : "";
    for (const char* flag : {"--local-rank", "--local_rank"}) {
      std::string f = flag;
      if (a == f && i + 1 < argc) return parse_int(f, argv[i + 1]);
      if (a.rfind(f + "=", 0) == 0) return parse_int(f, a.substr(f.size() + 1));
    }
  }
  return std::nullopt;
}

int port_value(const char* name, int port) {
  if (port < 1 || port > 65535)
    throw usage_error(std::string(name) + "=" + std::to_string(port) + " is not a TCP port (1-65535)", kLaunchHint);
  return port;
}

void validate(const WorkerIdentity& id) {
  auto fail = [](const std::string& what) { return usage_error(what, kLaunchHint); };
  if (id.world_size < 1) throw fail("WORLD_SIZE=" + std::to_string(id.world_size) + " must be at least 1");
  if (id.rank < 0 || id.rank >= id.world_size)
    throw fail("RANK=" + std::to_string(id.rank) + " is outside 0.." + std::to_string(id.world_size - 1) +
               " (WORLD_SIZE=" + std::to_string(id.world_size) + ")");
  if (id.local_world_size < 0) throw fail("LOCAL_WORLD_SIZE must not be negative");
  if (id.local_rank < 0 || (id.local_world_size > 0 && id.local_rank >= id.local_world_size))
    throw fail("LOCAL_RANK=" + std::to_string(id.local_rank) + " is outside 0.." +
               std::to_string(id.local_world_size - 1) + " (LOCAL_WORLD_SIZE=" +
               std::to_string(id.local_world_size) + ")");
  if (id.num_nodes < 0 || (id.num_nodes > 0 && (id.node_rank < 0 || id.node_rank >= id.num_nodes)))
    throw fail("node rank " + std::to_string(id.node_rank) + " is outside 0.." + std::to_string(id.num_nodes - 1));
}

void finish(WorkerIdentity& id) {
  id.key_prefix = "run/" + id.run_id + "/attempt/" + std::to_string(id.restart_count) + "/";
}

// LOCAL_RANK (or the launcher's variable for it) and --local-rank must agree where both are given.
int merged_local_rank(std::optional<int> env_local_rank, std::optional<int> argv_local_rank) {
  if (env_local_rank && argv_local_rank && *env_local_rank != *argv_local_rank)
    throw usage_error("LOCAL_RANK=" + std::to_string(*env_local_rank) + " but --local-rank " +
                          std::to_string(*argv_local_rank) + " was passed",
                      "pass one of them, or the same value");
  return env_local_rank ? *env_local_rank : argv_local_rank.value_or(0);
}

// Under `tessera launch` every variable of its contract is required, and the launcher serves the
// store on MASTER_ADDR:MASTER_PORT itself.
WorkerIdentity tessera_launch_identity(const EnvLookup& env, std::optional<int> argv_local_rank) {
  const char* ctx = "TESSERA_LAUNCHER is set";
  WorkerIdentity id;
  id.launcher = LauncherKind::Tessera;
  id.rank = required_int(env, "RANK", ctx);
  id.world_size = required_int(env, "WORLD_SIZE", ctx);
  id.local_rank = merged_local_rank(required_int(env, "LOCAL_RANK", ctx), argv_local_rank);
  id.local_world_size = required_int(env, "LOCAL_WORLD_SIZE", ctx);
  id.node_rank = required_int(env, "GROUP_RANK", ctx);
  id.num_nodes = required_int(env, "GROUP_WORLD_SIZE", ctx);
  id.master_addr = lookup(env, "MASTER_ADDR").value_or("");
  if (id.master_addr.empty()) throw usage_error(std::string(ctx) + " but MASTER_ADDR is not", kLaunchHint);
  id.master_port = port_value("MASTER_PORT", required_int(env, "MASTER_PORT", ctx));
  id.store_host = id.master_addr;
  id.store_port = id.master_port;
  id.serve_store = false;
  id.run_id = lookup(env, "TORCHELASTIC_RUN_ID").value_or("none");
  id.restart_count = int_var(env, "TORCHELASTIC_RESTART_COUNT").value_or(0);
  id.job_token = lookup(env, "TESSERA_JOB_TOKEN").value_or("");
  if (id.job_token.empty()) throw usage_error(std::string(ctx) + " but TESSERA_JOB_TOKEN is not", kLaunchHint);
  validate(id);
  finish(id);
  return id;
}

// Where torchrun and Slurm put a worker's place in the job; only RANK and WORLD_SIZE (or
// theirs) are required.
struct RankVariables {
  const char* context;  // for messages: why this launcher was chosen
  const char *rank, *world_size, *local_rank;
  const char* local_world_size;  // nullptr where the caller derives it
  const char *node_rank, *num_nodes;
};

void read_ranks(const EnvLookup& env, std::optional<int> argv_local_rank, const RankVariables& v, WorkerIdentity& id) {
  id.rank = required_int(env, v.rank, v.context);
  id.world_size = required_int(env, v.world_size, v.context);
  id.local_rank = merged_local_rank(int_var(env, v.local_rank), argv_local_rank);
  if (v.local_world_size) id.local_world_size = int_var(env, v.local_world_size).value_or(0);
  id.node_rank = int_var(env, v.node_rank).value_or(0);
  id.num_nodes = int_var(env, v.num_nodes).value_or(0);
}

void read_torchrun_ranks(const EnvLookup& env, std::optional<int> argv_local_rank, WorkerIdentity& id) {
  id.launcher = LauncherKind::Torchrun;
  read_ranks(env, argv_local_rank,
             {"RANK or WORLD_SIZE is set", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK",
              "GROUP_WORLD_SIZE"},
             id);
  id.run_id = lookup(env, "TORCHELASTIC_RUN_ID").value_or("none");
  id.restart_count = int_var(env, "TORCHELASTIC_RESTART_COUNT").value_or(0);
}

void read_slurm_ranks(const EnvLookup& env, std::optional<int> argv_local_rank, WorkerIdentity& id) {
  id.launcher = LauncherKind::Slurm;
  read_ranks(env, argv_local_rank,
             {"SLURM_PROCID is set", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", nullptr, "SLURM_NODEID",
              "SLURM_NNODES"},
             id);
  auto tasks = lookup(env, "SLURM_STEP_TASKS_PER_NODE");
  if (!tasks) tasks = lookup(env, "SLURM_TASKS_PER_NODE");
  if (!tasks) tasks = lookup(env, "SLURM_NTASKS_PER_NODE");
  id.local_world_size = tasks ? slurm_tasks_on_node(*tasks, id.node_rank) : 0;
  auto job = lookup(env, "SLURM_JOB_ID");
  auto step = lookup(env, "SLURM_STEP_ID");
  id.run_id = job ? *job + (step ? "." + *step : "") : "none";
  id.restart_count = int_var(env, "SLURM_RESTART_COUNT").value_or(0);
}

// MASTER_ADDR and MASTER_PORT; Slurm sets neither, so there they default to the job's first host
// and 29500. Returns MASTER_PORT as the environment gave it.
std::optional<int> read_master(const EnvLookup& env, WorkerIdentity& id) {
  id.master_addr = lookup(env, "MASTER_ADDR").value_or("");
  if (id.master_addr.empty() && id.launcher == LauncherKind::Slurm) {
    auto nodes = lookup(env, "SLURM_JOB_NODELIST");
    if (!nodes) nodes = lookup(env, "SLURM_NODELIST");
    if (nodes) id.master_addr = slurm_first_host(*nodes);
  }
  auto master_port = int_var(env, "MASTER_PORT");
  if (master_port) id.master_port = port_value("MASTER_PORT", *master_port);
  else if (id.launcher == LauncherKind::Slurm) id.master_port = 29500;
  return master_port;
}

// Several ranks need tessera's store: on MASTER_ADDR, at TESSERA_STORE_PORT or MASTER_PORT + 1
// (torchrun keeps its own store on MASTER_PORT), served by rank 0.
void read_store(const EnvLookup& env, bool master_port_set, WorkerIdentity& id) {
  if (id.master_addr.empty())
    throw usage_error(std::string("this is rank ") + std::to_string(id.rank) + " of " + std::to_string(id.world_size) +
                          " (" + launcher_kind_name(id.launcher) + ") but MASTER_ADDR is not set",
                      id.launcher == LauncherKind::Slurm
                          ? "export MASTER_ADDR=$(scontrol show hostnames \"$SLURM_JOB_NODELIST\" | head -n 1) before srun"
                          : "export MASTER_ADDR=<address of the node that runs rank 0> on every node");
  if (!master_port_set && id.launcher != LauncherKind::Slurm)
    throw usage_error("this is rank " + std::to_string(id.rank) + " of " + std::to_string(id.world_size) +
                          " but MASTER_PORT is not set",
                      "export MASTER_PORT=<a free port on the rank-0 node> on every node");
  id.store_host = id.master_addr;
  auto store_port = int_var(env, "TESSERA_STORE_PORT");
  id.store_port = store_port ? port_value("TESSERA_STORE_PORT", *store_port) : id.master_port + 1;
  if (id.store_port > 65535)
    throw usage_error("MASTER_PORT + 1 = " + std::to_string(id.store_port) + " is not a TCP port",
                      "set TESSERA_STORE_PORT to a free port for tessera's store");
  id.serve_store = id.rank == 0;
}

}  // namespace

const char* launcher_kind_name(LauncherKind kind) {
  switch (kind) {
    case LauncherKind::Tessera: return "tessera launch";
    case LauncherKind::Torchrun: return "torchrun";
    case LauncherKind::Slurm: return "Slurm";
    case LauncherKind::None: return "no launcher";
  }
  return "?";
}

std::string WorkerIdentity::describe() const {
  auto of = [](int v) { return v > 0 ? std::to_string(v) : std::string("?"); };
  std::string s = "rank " + std::to_string(rank) + " of " + std::to_string(world_size) + " (local " +
                  std::to_string(local_rank) + " of " + of(local_world_size) + ", node " +
                  std::to_string(node_rank) + " of " + of(num_nodes) + ") via " + launcher_kind_name(launcher);
  if (!store_host.empty())
    s += "; store " + store_host + ":" + std::to_string(store_port) + (serve_store ? " (served by this rank)" : "");
  return s;
}

std::string derived_job_token(const std::string& run_id, int store_port) {
  return "tessera-job:" + run_id + ":" + std::to_string(store_port);
}

int slurm_tasks_on_node(const std::string& text, int node_id) {
  // Items "N" or "N(xM)", comma separated.
  size_t pos = 0;
  int node = 0;
  while (pos < text.size()) {
    size_t comma = text.find(',', pos);
    std::string item = text.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos);
    pos = comma == std::string::npos ? text.size() : comma + 1;
    int tasks = 0, repeat = 1, used = 0;
    const int n = static_cast<int>(item.size());
    bool ok = (std::sscanf(item.c_str(), "%d(x%d)%n", &tasks, &repeat, &used) == 2 && used == n) ||
              (repeat = 1, used = 0, std::sscanf(item.c_str(), "%d%n", &tasks, &used) == 1 && used == n);
    if (!ok || tasks < 0 || repeat < 1) return 0;
    if (node_id < node + repeat) return tasks;
    node += repeat;
  }
  return 0;
}

std::string slurm_first_host(const std::string& nodelist) {
  int depth = 0;
  size_t end = nodelist.size();
  for (size_t i = 0; i < nodelist.size(); ++i) {
    if (nodelist[i] == '[') ++depth;
    if (nodelist[i] == ']') --depth;
    if (nodelist[i] == ',' && depth == 0) {
      end = i;
      break;
    }
  }
  std::string first = nodelist.substr(0, end);
  size_t open = first.find('[');
  if (open == std::string::npos) return first;
  size_t close = first.find(']', open);
  if (close == std::string::npos) return first;
  std::string range = first.substr(open + 1, close - open - 1);
  range = range.substr(0, range.find(','));
  range = range.substr(0, range.find('-'));
  return first.substr(0, open) + range + first.substr(close + 1);
}

WorkerIdentity from_environment(int argc, char** argv) {
  return from_environment(argc, argv, [](const char* name) -> const char* { return std::getenv(name); });
}

WorkerIdentity from_environment(int argc, char** argv, const EnvLookup& env) {
  const std::optional<int> argv_local_rank = local_rank_from_argv(argc, argv);
  if (lookup(env, "TESSERA_LAUNCHER")) return tessera_launch_identity(env, argv_local_rank);

  WorkerIdentity id;
  if (lookup(env, "RANK") || lookup(env, "WORLD_SIZE")) {
    read_torchrun_ranks(env, argv_local_rank, id);
  } else if (lookup(env, "SLURM_PROCID")) {
    read_slurm_ranks(env, argv_local_rank, id);
  } else {
    id.launcher = LauncherKind::None;
    id.local_rank = merged_local_rank(std::nullopt, argv_local_rank);
    id.local_world_size = 1;
    id.run_id = "none";
  }
  const std::optional<int> master_port = read_master(env, id);
  validate(id);
  if (id.world_size > 1) read_store(env, master_port.has_value(), id);
  id.job_token = lookup(env, "TESSERA_JOB_TOKEN").value_or(derived_job_token(id.run_id, id.store_port));
  finish(id);
  return id;
}

std::map<std::string, std::string> worker_variables(const WorkerSlot& s) {
  auto num = [](int x) { return std::to_string(x); };
  std::map<std::string, std::string> v = {
      {"TESSERA_LAUNCHER", num(1)},
      {"RANK", num(s.rank)},
      {"LOCAL_RANK", num(s.local_rank)},
      {"WORLD_SIZE", num(s.world_size)},
      {"LOCAL_WORLD_SIZE", num(s.local_world_size)},
      {"GROUP_RANK", num(s.node_rank)},
      {"GROUP_WORLD_SIZE", num(s.num_nodes)},
      {"ROLE_NAME", s.role},
      {"ROLE_RANK", num(s.rank)},
      {"ROLE_WORLD_SIZE", num(s.world_size)},
      {"MASTER_ADDR", s.master_addr},
      {"MASTER_PORT", num(s.master_port)},
      {"TORCHELASTIC_RUN_ID", s.run_id},
      {"TORCHELASTIC_RESTART_COUNT", num(s.restart_count)},
      {"TORCHELASTIC_MAX_RESTARTS", num(s.max_restarts)},
      {"TESSERA_JOB_TOKEN", s.job_token},
  };
  if (s.set_omp_num_threads) v.emplace("OMP_NUM_THREADS", num(1));
  return v;
}

}  // namespace tessera::launch
