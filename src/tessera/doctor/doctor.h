// `tessera doctor`: the two-server guide's pre-flight checklist as one command, run with the
// same flags as `tessera train` on one node alone or under `tessera launch` on every rank.
//
// Every check is a Row: a name ("data: prefix corpus_text_document"), a status, what was found
// and, for anything not PASS, the fix. Checks that one process can make (devices, build,
// environment, data, disk, config) run on every rank; checks that need the job (build hash
// agreement, store reachability, link bandwidth, collectives, slow ranks) run across the world
// communicator, and rank 0 gathers every rank's rows through it, merges identical ones
// ("all ranks") and prints one table (or, with --json, one JSON document). The exit status is
// 1 when any row FAILs, else 0. docs/doctor.md lists the checks and the thresholds.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "tessera/core/options.h"
#include "tessera/device/device.h"
#include "tessera/model/memory_estimate.h"
#include "tessera/train/rank_memory.h"

namespace tessera::doctor {

enum class Status { Pass, Info, Warn, Fail };
const char* status_name(Status s);  // "PASS", "INFO", "WARN", "FAIL"

struct Row {
  std::string check;
  Status status = Status::Pass;
  std::string detail;
  std::string fix;    // empty for PASS
  std::string scope;  // "all ranks", "rank 1 (hostb)", "world"; filled when merging
};

// The doctor's own flags, removed before the rest reaches `tessera train`'s parser:
//   --json                    print a JSON document instead of the table
//   --min-free-disk-gb X      free space required in the cache folder, the current folder and
//                             --save's folder (default 1); the cache folder also needs room for
//                             the estimated dataset index cache when it is not built yet
//   --doctor-timeout S        seconds for reaching the store and every collective (default 60)
//   --bandwidth-mb N          bytes per link probe message, in MiB (default 8)
// --save/--load stay in train's flags and are remembered here: the checkpoints rows check
// them where train supports checkpoints; where train rejects them, the other train flags are
// still checked and a row says checkpoints were not checked.
struct DoctorOptions {
  bool json = false;
  double min_free_disk_gb = 1.0;
  double timeout_seconds = 60.0;
  int64_t bandwidth_bytes = 8 << 20;
  std::optional<std::string> save, load;
  std::vector<std::string> train_args;        // everything else, for parse_train_args
  std::vector<std::string> checkpoint_flags;  // --save/--load and their values as given
  std::vector<std::string> train_args_without_checkpoints;
};
// Throws a usage error for a malformed doctor flag value.
DoctorOptions parse_doctor_options(int argc, char** argv);

// ---- checks one process makes ---------------------------------------------------------------
std::vector<Row> check_devices_and_build(uint64_t build_hash);
// The device --device names (other than the CPU, which check_devices_and_build covers): its
// description, driver and memory, and a small linear + GELU on it against the CPU backend.
// One FAIL row when it cannot be opened.
std::vector<Row> check_compute_device(const std::string& spec);
// The rows every built backend reports about itself (Backend::doctor_rows: CUDA's driver,
// libraries and GPUs on every run; with --device cuda on a GPU its GEMM and NCCL rows).
// `spec`: --device; the backend it names gets its device and FAILs what is missing.
std::vector<Row> check_backends(const std::string& spec);
// FNV-1a 64 of a file (the running binary: /proc/self/exe); 0 when unreadable.
uint64_t file_hash(const std::string& path);
// GLOO_SOCKET_IFNAME (or the route to MASTER_ADDR) and NCCL_SOCKET_IFNAME.
std::vector<Row> check_interfaces(const std::string& gloo_ifname, const std::optional<std::string>& nccl_ifname,
                                  const std::string& master_addr, int master_port, int num_nodes);
// Connects to host:port, retrying refused connections until `timeout_seconds`.
Row probe_tcp(const std::string& label, const std::string& host, int port, double timeout_seconds);
// Data prefixes, tokenizer files, the cache folder (the table parse of train's flags).
struct DataPlan {
  std::vector<std::string> prefixes;  // every prefix named by the data flags
  size_t split_prefixes = 0;          // the first this many are divided by --split
  std::string split;                  // --split, or Megatron's default "969, 30, 1"
  std::string cache_dir;              // --data-cache-path or Megatron's default; "" for mock data
  bool mock = false;
};
DataPlan data_plan(const ParsedOptions& p);
// The model's padded vocabulary, which every token id of the data must be below.
struct VocabularyLimit {
  int64_t padded_size = 0;
  std::string description;  // data::describe_vocabulary
};
// `vocab`: absent when train's flags did not parse (the ids are then not checked).
std::vector<Row> check_data(const ParsedOptions& p, const DataPlan& plan,
                            const std::optional<VocabularyLimit>& vocab = std::nullopt);
Row check_tokenizer(const ParsedOptions& p);
// Free space at `path` (or its nearest existing parent) against `min_free_bytes`.
Row check_disk(const std::string& label, const std::string& path, uint64_t min_free_bytes);
// Whether a file can be created in `dir` (or, when it does not exist, its nearest parent):
// check_folder_writable's verdict as a row, its hint naming `flag`.
Row check_writable(const std::string& label, const std::string& dir, const std::string& flag);
// Every rank's estimate from its own layout (train/rank_memory.h): the largest is reported,
// and the ranks on this node (`node_ranks`, global ranks) together against the machine.
Row check_memory(const std::vector<RankMemory>& ranks, const std::vector<int>& node_ranks, const MemoryInfo& memory,
                 uint64_t available_bytes, int micro_batch, int num_layers, int hidden_size);
// --load: a folder whose latest checkpoint loads: every file's checksum, and the parameters'
// names and shapes against `config` (null: flags did not parse; only the tracker is read).
// Parameters are loaded into a scratch buffer when they fit a quarter of `available_bytes`.
Row check_load(const std::string& dir, const GPTConfig* config, uint64_t available_bytes);
// MemAvailable from /proc/meminfo (falls back to memory_info().free_bytes).
uint64_t available_memory_bytes();

// ---- output ----------------------------------------------------------------------------------
bool any_failed(const std::vector<Row>& rows);
std::string format_table(const std::vector<Row>& rows);
std::string format_json(const std::vector<Row>& rows, int world_size);
std::string serialize_rows(const std::vector<Row>& rows);
std::vector<Row> deserialize_rows(const std::string& text);
// Rows of every rank (rank order) to one list: identical rows become one with the scope
// "all ranks" (or "ranks 0, 2"); hosts[r] names rank r's host.
std::vector<Row> merge_rows(const std::vector<std::vector<Row>>& per_rank, const std::vector<std::string>& hosts);

// The subcommand. argv excludes "doctor".
int run_doctor(int argc, char** argv);

}  // namespace tessera::doctor
