// `tessera doctor`'s flow: local checks on every rank, then (under a launcher) the world
// communicator's checks, the rows gathered to rank 0, merged and printed.
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>

#include "tessera/comm/backend.h"
#include "tessera/core/error.h"
#include "tessera/data/dataset_config.h"
#include "tessera/data/token_id_range.h"
#include "tessera/device/registry.h"
#include "tessera/doctor/doctor.h"
#include "tessera/doctor/world_checks.h"
#include "tessera/launch/job_store.h"
#include "tessera/launch/worker_env.h"
#include "tessera/parallel/topology.h"
#include "tessera/train/arguments.h"

namespace tessera::doctor {
namespace {

std::string this_host() {
  char h[256] = {0};
  gethostname(h, sizeof h - 1);
  return h;
}

// The cache folder's index files (name and size), for comparing nodes.
void list_cache(const std::string& dir, RankInfo& info) {
  if (dir.empty()) return;
  std::vector<std::string> entries;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(dir, ec)) {
    const std::string n = e.path().filename().string();
    if (n.size() > 4 && n.compare(n.size() - 4, 4, ".npy") == 0)
      entries.push_back(n + ":" + std::to_string(e.file_size(ec)));
  }
  std::sort(entries.begin(), entries.end());
  uint64_t h = 1469598103934665603ULL;
  for (const std::string& e : entries)
    for (unsigned char c : e + "\n") h = (h ^ c) * 1099511628211ULL;
  info.cache_files = static_cast<int32_t>(entries.size());
  info.cache_listing = h;
}

// Launchers number a node's processes contiguously (torchrun, tessera launch, Slurm's block
// distribution): this node holds global ranks rank - local_rank onwards.
std::vector<int> ranks_on_this_node(const launch::WorkerIdentity& id) {
  if (id.local_world_size <= 0) return {id.rank};
  std::vector<int> ranks;
  for (int r = id.rank - id.local_rank; r < id.rank - id.local_rank + id.local_world_size && r < id.world_size; ++r)
    ranks.push_back(r);
  return ranks;
}

int category_rank(const std::string& check) {
  static const char* order[] = {"devices", "build",       "environment", "network", "collectives",
                                "data",    "checkpoints", "disk",        "config"};
  const std::string cat = check.substr(0, check.find(':'));
  for (int i = 0; i < 9; ++i)
    if (cat == order[i]) return i;
  return 9;
}

void print_help() {
  std::printf(
      "usage: tessera doctor [--json] [--min-free-disk-gb X] [--doctor-timeout S] [--bandwidth-mb N] "
      "<tessera train flags>\n\n"
      "Runs the pre-flight checks for the job that `tessera train` with the same flags would run: devices and build,\n"
      "environment and interfaces, the store and the links between nodes, collectives, data, disk, config and\n"
      "memory. Alone on one node, or under `tessera launch` on every rank (rank 0 prints). Exits 1 on any FAIL.\n\n"
      "  --json               a JSON document instead of the table\n"
      "  --min-free-disk-gb   free space required in the cache folder, the current folder and --save (default 1)\n"
      "  --doctor-timeout     seconds to reach the store and for every collective (default 60)\n"
      "  --bandwidth-mb       MiB per link-probe message (default 8)\n\n"
      "`tessera train --help` lists the train flags.\n");
}

}  // namespace

DoctorOptions parse_doctor_options(int argc, char** argv) {
  DoctorOptions o;
  auto number = [&](int& i, const std::string& flag) {
    if (i + 1 >= argc) throw usage_error(flag + " needs a value");
    char* end = nullptr;
    const double v = std::strtod(argv[++i], &end);
    if (!end || *end || !(v >= 0) || !std::isfinite(v))
      throw usage_error(flag + " takes a non-negative number, got '" + std::string(argv[i]) + "'");
    return v;
  };
  for (int i = 0; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--json") {
      o.json = true;
    } else if (a == "--min-free-disk-gb") {
      o.min_free_disk_gb = number(i, a);
    } else if (a == "--doctor-timeout") {
      o.timeout_seconds = std::max(0.5, number(i, a));
    } else if (a == "--bandwidth-mb") {
      o.bandwidth_bytes = std::max<int64_t>(1, static_cast<int64_t>(number(i, a) * (1 << 20)));
    } else if (a == "--save" || a == "--load" || a.rfind("--save=", 0) == 0 || a.rfind("--load=", 0) == 0 ||
               a.rfind("--save-", 0) == 0 || a.rfind("--no-save", 0) == 0 || a.rfind("--no-load", 0) == 0 ||
               a == "--finetune") {
      // The checkpoint family: kept for train, left out of the retry where train rejects them.
      const bool path_flag = a == "--save" || a == "--load" || a.rfind("--save=", 0) == 0 || a.rfind("--load=", 0) == 0;
      if (!path_flag) {
        o.train_args.push_back(a);
        o.checkpoint_flags.push_back(a);
        if (a.find('=') == std::string::npos && i + 1 < argc && std::strncmp(argv[i + 1], "--", 2) != 0 &&
            a.rfind("--save-", 0) == 0) {  // --save-interval N (switches take no value)
          o.train_args.push_back(argv[++i]);
          o.checkpoint_flags.push_back(argv[i]);
        }
        continue;
      }
      const bool save = a.rfind("--save", 0) == 0;
      o.train_args.push_back(a);
      o.checkpoint_flags.push_back(a);
      std::string value;
      if (a.find('=') != std::string::npos) {
        value = a.substr(a.find('=') + 1);
      } else if (i + 1 < argc && std::strncmp(argv[i + 1], "--", 2) != 0) {
        value = argv[++i];
        o.train_args.push_back(value);
        o.checkpoint_flags.push_back(value);
      }
      (save ? o.save : o.load) = value;
      continue;
    } else {
      o.train_args.push_back(a);
      o.train_args_without_checkpoints.push_back(a);
    }
  }
  return o;
}

namespace {

// The launcher row, and this process's place in the job (a lone process when the launcher's
// variables are inconsistent).
launch::WorkerIdentity identify_worker(int argc, char** argv, std::vector<Row>& rows) {
  try {
    launch::WorkerIdentity id = launch::from_environment(argc, argv);
    rows.push_back({"environment: launcher", Status::Pass,
                    id.distributed() ? id.describe() : "a single process (no launcher variables)", "", ""});
    if (id.distributed() && (id.master_addr.empty() || id.master_port <= 0))
      rows.back() = {"environment: launcher", Status::Fail,
                     "MASTER_ADDR/MASTER_PORT not set for world size " + std::to_string(id.world_size),
                     "export MASTER_ADDR=<node 0 IP> MASTER_PORT=<free port>", ""};
    return id;
  } catch (const Error& e) {
    rows.push_back({"environment: launcher", Status::Fail, e.what(),
                    e.hint().empty() ? "start the job with `tessera launch` or set RANK, WORLD_SIZE, MASTER_ADDR, "
                                       "MASTER_PORT consistently"
                                     : e.hint(),
                    ""});
    return launch::WorkerIdentity{};
  }
}

// GLOO_SOCKET_IFNAME and NCCL_SOCKET_IFNAME (or the route to MASTER_ADDR); false when the
// interface the collectives would use FAILs.
bool check_network_interfaces(const launch::WorkerIdentity& id, std::vector<Row>& rows) {
  const char* gloo_if = std::getenv("GLOO_SOCKET_IFNAME");
  const char* nccl_if = std::getenv("NCCL_SOCKET_IFNAME");
  bool interface_ok = true;
  if (!id.distributed() && !(gloo_if && *gloo_if) && !nccl_if) return interface_ok;
  for (Row& r : check_interfaces(gloo_if ? gloo_if : "", nccl_if ? std::optional<std::string>(nccl_if) : std::nullopt,
                                 id.master_addr, id.master_port, std::max(1, id.num_nodes))) {
    if (r.check == "environment: interface" && r.status == Status::Fail) interface_ok = false;
    rows.push_back(r);
  }
  return interface_ok;
}

// Train's flags: the table alone (enough for the data checks), then train's whole parse.
struct TrainFlags {
  std::optional<ParsedOptions> table;
  std::optional<TrainArgs> args;
  bool takes_checkpoints = true;  // false when train rejects --save/--load (no support yet)
};

std::optional<ParsedOptions> parse_table(const std::vector<std::string>& args) {
  std::vector<char*> argv;
  for (const std::string& s : args) argv.push_back(const_cast<char*>(s.c_str()));
  try {
    return train_option_table().parse(static_cast<int>(argv.size()), argv.data());
  } catch (const Error&) {
    return std::nullopt;
  }
}

TrainFlags parse_train_flags(const DoctorOptions& opt, const launch::WorkerIdentity& id, std::vector<Row>& rows) {
  TrainFlags f;
  f.table = parse_table(opt.train_args);
  if (!f.table && !opt.checkpoint_flags.empty()) {
    f.table = parse_table(opt.train_args_without_checkpoints);
    f.takes_checkpoints = !f.table;
  }
  std::vector<char*> argv;
  for (const std::string& s : opt.train_args) argv.push_back(const_cast<char*>(s.c_str()));
  try {
    ParsedOptions parsed;
    f.args = parse_train_args(static_cast<int>(argv.size()), argv.data(), &parsed, id.world_size);
    rows.push_back({"config: flags", Status::Pass,
                    "valid for `tessera train` at world size " + std::to_string(id.world_size), "", ""});
  } catch (const Error& e) {
    rows.push_back({"config: flags", Status::Fail, e.what(),
                    e.hint().empty() ? "fix the flag named (`tessera train --help` lists them)" : e.hint(), ""});
  }
  return f;
}

// The parallel layout and every rank's memory.
// The device the run's memory lives on: --device's when it opens (its own row says why when
// not), else the host.
Device& memory_device(const TrainFlags& f) {
  if (!f.table) return cpu_device();
  try {
    return open_device(f.table->get_string("--device"));
  } catch (const Error&) {
    return cpu_device();
  }
}

void check_config(const TrainFlags& f, const launch::WorkerIdentity& id, std::vector<Row>& rows) {
  if (f.table) {
    try {
      Topology topology(id.world_size, id.rank, static_cast<int>(f.table->get_int("--tensor-model-parallel-size")),
                        static_cast<int>(f.table->get_int("--pipeline-model-parallel-size")),
                        static_cast<int>(f.table->get_int("--context-parallel-size")),
                        static_cast<int>(f.table->get_int("--expert-model-parallel-size")));
      if (auto layers = f.table->get_opt_int("--num-layers")) topology.check_num_layers(static_cast<int>(*layers));
      const std::string d = topology.describe();  // rank-independent part only, so ranks merge
      rows.push_back({"config: layout", Status::Pass, d.substr(0, d.find(';')), "", ""});
    } catch (const Error& e) {
      rows.push_back({"config: layout", Status::Fail, e.what(), e.hint(), ""});
    }
  }
  if (!f.args) {
    rows.push_back({"config: memory", Status::Warn, "not estimated: the flags did not parse",
                    "fix the flags (config: flags) and run again", ""});
    return;
  }
  // The run's device and mode decide attention's state (the device's fused kernels: a
  // log-sum-exp; deterministic: [B,NH,T,T]) and whose memory holds the estimate: the host's,
  // shared by this node's ranks, or the device's own (one device per rank).
  Device& device = memory_device(f);
  device.set_deterministic_mode(f.args->deterministic_mode);
  const MemoryInfo memory = device.memory_info();
  const bool host = device.is_host();
  rows.push_back(check_memory(estimate_memory_per_rank(*f.args, device),
                              host ? ranks_on_this_node(id) : std::vector<int>{id.rank}, memory,
                              host ? available_memory_bytes() : memory.free_bytes,
                              static_cast<int>(f.args->micro_batch_size), f.args->model.num_layers,
                              f.args->model.hidden_size));
}

// Data, tokenizer and the cache folder; returns the cache folder ("" without one).
std::string check_data_and_tokenizer(const TrainFlags& f, std::vector<Row>& rows) {
  if (!f.table) {
    rows.push_back({"data: prefixes", Status::Warn, "not checked: the flags did not parse",
                    "fix the flags (config: flags) and run again", ""});
    return "";
  }
  std::string cache_dir;
  try {
    DataPlan plan = data_plan(*f.table);
    cache_dir = plan.cache_dir;
    std::optional<VocabularyLimit> vocab;
    if (f.args)
      vocab = VocabularyLimit{f.args->model.padded_vocab_size,
                              data::describe_vocabulary(f.args->tokenizer, f.args->model.vocab_size,
                                                        f.args->model.padded_vocab_size)};
    for (Row& r : check_data(*f.table, plan, vocab)) rows.push_back(r);
  } catch (const Error& e) {
    rows.push_back({"data: prefixes", Status::Fail, e.what(), e.hint(), ""});
  }
  rows.push_back(check_tokenizer(*f.table));
  return cache_dir;
}

// One checkpoint's size (parameters, and the optimizer unless --no-save-optim); 0 without --save.
uint64_t checkpoint_bytes(const DoctorOptions& opt, const TrainFlags& f) {
  if (!opt.save || !f.takes_checkpoints || !f.args) return 0;
  const GPTMemoryEstimate e = estimate_gpt_memory(f.args->model, 1);
  const bool with_optimizer = !(f.table && f.table->get_bool("--no-save-optim"));
  const uint64_t f32_parameters = e.gradient_bytes;  // checkpoints keep the f32 (main) parameters
  return f32_parameters + (with_optimizer ? e.optimizer_bytes : 0);
}

void check_checkpoints(const DoctorOptions& opt, const TrainFlags& f, std::vector<Row>& rows) {
  if (!opt.save && !opt.load) {
    rows.push_back({"checkpoints", Status::Info, "no --save/--load: nothing to check", "", ""});
    return;
  }
  if (!f.takes_checkpoints) {
    std::string given;
    for (const std::string& s : opt.checkpoint_flags) given += (given.empty() ? "" : " ") + s;
    rows.push_back({"checkpoints", Status::Warn,
                    "not checked yet: " + given +
                        " given, but this tessera train does not support checkpoints (it rejects --save/--load)",
                    "drop --save/--load, or use a tessera build with checkpoint support", ""});
    return;
  }
  if (opt.save) {
    Row w = check_writable("checkpoints: --save", *opt.save, "--save");
    if (const uint64_t bytes = checkpoint_bytes(opt, f))
      w.detail += "; one checkpoint ~" + std::to_string(bytes >> 20) + " MiB";
    rows.push_back(w);
  }
  if (opt.load) rows.push_back(check_load(*opt.load, f.args ? &f.args->model : nullptr, available_memory_bytes()));
}

void check_disks(const DoctorOptions& opt, const TrainFlags& f, const std::string& cache_dir, std::vector<Row>& rows) {
  const uint64_t min_free = static_cast<uint64_t>(opt.min_free_disk_gb * 1e9);
  if (!cache_dir.empty()) {
    uint64_t need = min_free;
    if (f.args) {  // the index arrays of the three splits: ~20 bytes per sample, when not built yet
      const data::SplitSizes sizes = data::requested_sample_counts(
          f.args->train_iters, f.args->train_samples, f.args->global_batch_size, f.args->eval_interval,
          f.args->eval_iters);
      for (const auto& s : sizes) need += s ? static_cast<uint64_t>(*s) * 20 : 0;
    }
    rows.push_back(check_disk("disk: cache folder", cache_dir, need));
  }
  rows.push_back(check_disk("disk: current folder", ".", min_free));
  if (opt.save && !opt.save->empty())  // room for the estimated checkpoint, on top of the floor
    rows.push_back(check_disk("disk: --save", *opt.save, min_free + checkpoint_bytes(opt, f)));
}

// The job's store and world communicator (null, with a FAIL row saying why, when either cannot
// be reached). `job_store` keeps the store's server alive on the rank that serves it.
std::unique_ptr<Communicator> connect_world(const DoctorOptions& opt, const launch::WorkerIdentity& id,
                                            bool interface_ok, launch::JobStore& job_store, std::vector<Row>& rows) {
  bool store_ok = true;
  if (!id.serve_store) {
    Row probe = probe_tcp("network: store", id.store_host, id.store_port, opt.timeout_seconds);
    store_ok = probe.status != Status::Fail;
    rows.push_back(probe);
  }
  if (!store_ok || !interface_ok) {
    rows.push_back({"collectives: connect", Status::Fail, "not attempted: the store or the interface failed above",
                    "fix the rows above on this rank; the other ranks wait for it until --doctor-timeout", ""});
    return nullptr;
  }
  const auto timeout = std::chrono::milliseconds(static_cast<int64_t>(opt.timeout_seconds * 1000));
  try {
    job_store = launch::open_job_store(id, timeout);
    if (id.serve_store)
      rows.push_back({"network: store", Status::Pass, "served by this rank on port " + std::to_string(id.store_port),
                      "", ""});
    CommOptions g;  // gloo: the doctor's checks move host memory
    g.timeout = timeout;
    g.master_addr = id.master_addr;
    g.master_port = id.master_port;
    g.key_prefix = id.key_prefix + "doctor/";
    return create_communicator(std::shared_ptr<Store>(std::move(job_store.store)), id.rank, id.world_size, g);
  } catch (const Error& e) {
    rows.push_back({"collectives: connect", Status::Fail, e.what(),
                    "every rank must reach every other: check `network: store`, GLOO_SOCKET_IFNAME and the "
                    "firewall on every node",
                    ""});
    return nullptr;
  }
}

// The world's checks, then every rank's rows gathered, merged and followed by the world's rows.
// On failure the world is dropped and this rank's rows come back with the failure.
std::vector<Row> run_world_checks(std::unique_ptr<Communicator>& world, const DoctorOptions& opt, const RankInfo& mine,
                                  std::vector<Row>& rows) {
  try {
    std::vector<RankInfo> info;
    const std::vector<Row> world_rows = world_checks(*world, opt, mine, info);
    std::vector<std::string> texts = all_gather_text(*world, serialize_rows(rows));
    std::vector<std::vector<Row>> per_rank;
    std::vector<std::string> hosts;
    for (size_t r = 0; r < texts.size(); ++r) {
      per_rank.push_back(deserialize_rows(texts[r]));
      hosts.push_back(info[r].host);
    }
    std::vector<Row> merged = merge_rows(per_rank, hosts);
    for (const Row& r : world_rows) merged.push_back(r);
    return merged;
  } catch (const Error& e) {
    world.reset();
    rows.push_back({"collectives: run", Status::Fail, e.what(),
                    e.hint().empty() ? "a rank stopped answering: see its own table" : e.hint(), ""});
    return {};
  }
}

}  // namespace

int run_doctor(int argc, char** argv) {
  for (int i = 0; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--help") || !std::strcmp(argv[i], "-h")) {
      print_help();
      return 0;
    }
  }
  const DoctorOptions opt = parse_doctor_options(argc, argv);
  std::vector<Row> rows;
  const std::string host = this_host();
  const launch::WorkerIdentity id = identify_worker(argc, argv, rows);
  RankInfo mine;
  mine.build_hash = file_hash("/proc/self/exe");
  mine.rank = id.rank;
  mine.node_rank = id.node_rank;
  std::strncpy(mine.host, host.c_str(), sizeof mine.host - 1);
  for (Row& r : check_devices_and_build(mine.build_hash)) rows.push_back(r);
  const bool interface_ok = check_network_interfaces(id, rows);

  const TrainFlags flags = parse_train_flags(opt, id, rows);
  const std::string device_spec = flags.table ? flags.table->get_string("--device") : "cpu";
  for (Row& r : check_compute_device(device_spec)) rows.push_back(r);
  for (Row& r : check_backends(device_spec)) rows.push_back(r);
  check_config(flags, id, rows);
  const std::string cache_dir = check_data_and_tokenizer(flags, rows);
  check_checkpoints(opt, flags, rows);
  check_disks(opt, flags, cache_dir, rows);

  launch::JobStore job_store;
  std::unique_ptr<Communicator> world;
  if (id.distributed()) world = connect_world(opt, id, interface_ok, job_store, rows);
  mine.speed_seconds = local_speed_seconds();
  list_cache(cache_dir, mine);

  std::vector<Row> merged;
  if (world) merged = run_world_checks(world, opt, mine, rows);
  if (!world) {
    for (Row& r : rows) r.scope = "rank " + std::to_string(id.rank) + " (" + host + ")";
    merged = rows;
  }
  std::stable_sort(merged.begin(), merged.end(),
                   [](const Row& a, const Row& b) { return category_rank(a.check) < category_rank(b.check); });
  const bool failed = any_failed(merged);
  if (!world || id.rank == 0) {
    const std::string text = opt.json ? format_json(merged, id.world_size) : format_table(merged);
    std::fwrite(text.data(), 1, text.size(), stdout);
    std::fflush(stdout);
  }
  if (world) {
    // Everyone has the result; rank 0 only exits after the others stop using the store it may serve.
    try {
      world->barrier();
    } catch (const Error&) {
    }
  }
  return failed ? 1 : 0;
}

}  // namespace tessera::doctor
