// The worker-side environment contract: who am I in the job, and where is tessera's store.
//
// One function, `from_environment`, reads the identity of this process as any of these
// launchers describe it (first match wins):
//
//   tessera launch      TESSERA_LAUNCHER is set. RANK, LOCAL_RANK, WORLD_SIZE,
//                       LOCAL_WORLD_SIZE, GROUP_RANK (node rank), GROUP_WORLD_SIZE (nodes),
//                       MASTER_ADDR, MASTER_PORT, TORCHELASTIC_RUN_ID,
//                       TORCHELASTIC_RESTART_COUNT, TESSERA_JOB_TOKEN.
//                       The launcher itself serves tessera's store on MASTER_ADDR:MASTER_PORT;
//                       no worker serves it (serve_store is false for every rank).
//   torchrun, or        RANK and WORLD_SIZE are set (LOCAL_RANK from the environment or, as
//   torch.distributed.  the old torch.distributed.launch passes it, `--local-rank N`,
//   launch, or by hand  `--local-rank=N`, `--local_rank N` or `--local_rank=N` in argv).
//                       torchrun owns MASTER_PORT (its own store is there), so tessera's store
//                       is on MASTER_ADDR:(TESSERA_STORE_PORT, else MASTER_PORT + 1), served by
//                       global rank 0 (serve_store is true there).
//   Slurm (srun)        SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID, SLURM_NODEID, SLURM_NNODES,
//                       SLURM_STEP_TASKS_PER_NODE / SLURM_TASKS_PER_NODE ("2(x3),1").
//                       MASTER_ADDR from the environment, else the first host of
//                       SLURM_JOB_NODELIST; MASTER_PORT from the environment, else 29500.
//                       The store is served by rank 0 as under torchrun.
//   nothing             a single process: rank 0 of 1; no store is needed.
//
// The job token (TESSERA_JOB_TOKEN, presented on every store connection so that a process of
// another job cannot join by mistake) comes from the environment; without a tessera launcher
// and without that variable every rank derives the same one from the run id
// (TORCHELASTIC_RUN_ID, else SLURM_JOB_ID.SLURM_STEP_ID, else "none") and the store port.
//
// Keys that a worker writes to the store should start with `key_prefix`, which names the run
// and the restart attempt, so that a restarted job never reads a key of the attempt before.
// The launcher's own keys start with "launch/" and are not for workers.
#pragma once

#include <functional>
#include <map>
#include <string>
#include <vector>

namespace tessera::launch {

enum class LauncherKind { Tessera, Torchrun, Slurm, None };
const char* launcher_kind_name(LauncherKind kind);

struct WorkerIdentity {
  LauncherKind launcher = LauncherKind::None;
  int rank = 0;              // global rank
  int world_size = 1;
  int local_rank = 0;        // rank on this node
  int local_world_size = 1;  // processes on this node; 0 when the launcher did not say
  int node_rank = 0;         // GROUP_RANK / SLURM_NODEID; 0 when the launcher did not say
  int num_nodes = 1;         // GROUP_WORLD_SIZE / SLURM_NNODES; 0 when the launcher did not say
  std::string master_addr;   // "" for a single process with nothing set
  int master_port = 0;
  // Where tessera's rendezvous store is, and whether this process must serve it.
  std::string store_host;
  int store_port = 0;
  bool serve_store = false;
  std::string job_token;
  std::string run_id;
  int restart_count = 0;
  std::string key_prefix;  // "run/<run_id>/attempt/<restart_count>/"

  bool distributed() const { return world_size > 1; }
  // One line for logs: "rank 3 of 4 (local 1 of 2, node 1 of 2) via tessera launch; store
  // 10.0.0.1:29500".
  std::string describe() const;
};

// How a variable is looked up; the default reads the process environment.
using EnvLookup = std::function<const char*(const char* name)>;

// Reads this process's identity as described above. argv is only read for `--local-rank`.
// Throws tessera::Error (usage) for contradictory or malformed values, naming the variable.
WorkerIdentity from_environment(int argc, char** argv);
WorkerIdentity from_environment(int argc, char** argv, const EnvLookup& env);

// The launcher's side of the contract: the variables `tessera launch` sets for one worker
// (names in the table above, plus torchrun's ROLE_*, TORCHELASTIC_MAX_RESTARTS and
// OMP_NUM_THREADS when asked). Values here override the inherited environment.
struct WorkerSlot {
  int rank = 0;
  int local_rank = 0;
  int world_size = 1;
  int local_world_size = 1;
  int node_rank = 0;
  int num_nodes = 1;
  std::string master_addr;
  int master_port = 0;
  std::string run_id;
  std::string job_token;
  std::string role = "default";
  int restart_count = 0;
  int max_restarts = 0;
  bool set_omp_num_threads = false;  // OMP_NUM_THREADS=1 (the caller checked it is unset)
};
std::map<std::string, std::string> worker_variables(const WorkerSlot& slot);

// The token every process of a job presents to the store when none is configured.
std::string derived_job_token(const std::string& run_id, int store_port);

// Slurm's task-count lists: "2(x3),1" with node 3 -> 1. Returns 0 when the node is beyond
// the list or the text is malformed.
int slurm_tasks_on_node(const std::string& tasks_per_node, int node_id);
// The first host of a Slurm node list: "gpu[07-09,12],cpu1" -> "gpu07".
std::string slurm_first_host(const std::string& nodelist);

}  // namespace tessera::launch
