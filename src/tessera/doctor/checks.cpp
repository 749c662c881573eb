// The checks one process makes on its own: devices, build, interfaces, store reachability,
// data, tokenizer, disk, memory.
#include <arpa/inet.h>
#include <dirent.h>
#include <fcntl.h>
#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <optional>
#include <thread>

#include "tessera/ckpt/checkpoint.h"
#include "tessera/comm/net_interface.h"
#include "tessera/core/error.h"
#include "tessera/core/file_io.h"
#include "tessera/data/dataset_config.h"
#include "tessera/data/indexed_dataset.h"
#include "tessera/data/token_id_range.h"
#include "tessera/data/tokenizer.h"
#include "tessera/device/registry.h"
#include "tessera/doctor/doctor.h"
#include "tessera/ops/kernel_table.h"

#ifndef TESSERA_VERSION
#define TESSERA_VERSION "unknown"
#endif

namespace tessera::doctor {
namespace {

std::string gib(double bytes) {
  char b[32];
  if (bytes < 1024.0 * 1024.0 * 1024.0) {
    std::snprintf(b, sizeof b, "%.1f MiB", bytes / (1024.0 * 1024.0));
  } else {
    std::snprintf(b, sizeof b, "%.1f GiB", bytes / (1024.0 * 1024.0 * 1024.0));
  }
  return b;
}
std::string mib(double bytes) {
  char b[32];
  std::snprintf(b, sizeof b, "%.1f MiB", bytes / (1024.0 * 1024.0));
  return b;
}
// The nearest existing folder at or above `path`.
std::string existing_parent(std::string path) {
  if (path.empty()) path = ".";
  struct stat st {};
  while (stat(path.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
    auto slash = path.find_last_of('/');
    if (slash == std::string::npos) return ".";
    if (slash == 0) return "/";
    path = path.substr(0, slash);
  }
  return path;
}

}  // namespace

uint64_t file_hash(const std::string& path) {
  std::FILE* f = std::fopen(path.c_str(), "rb");
  if (!f) return 0;
  uint64_t h = 1469598103934665603ULL;
  std::vector<unsigned char> buf(1 << 20);
  size_t n;
  while ((n = std::fread(buf.data(), 1, buf.size(), f)) > 0) {
    for (size_t i = 0; i < n; ++i) h = (h ^ buf[i]) * 1099511628211ULL;
  }
  std::fclose(f);
  return h;
}

uint64_t available_memory_bytes() {
  std::ifstream in("/proc/meminfo");
  std::string key;
  uint64_t value;
  std::string unit;
  while (in >> key >> value >> unit) {
    if (key == "MemAvailable:") return value * 1024;
  }
  return cpu_device().memory_info().free_bytes;
}

std::vector<Row> check_devices_and_build(uint64_t build_hash) {
  std::vector<Row> rows;
  const unsigned cores = std::thread::hardware_concurrency();
  const char* omp = std::getenv("OMP_NUM_THREADS");
  rows.push_back({"devices: cpu", cores > 0 ? Status::Pass : Status::Warn,
                  std::to_string(cores) + " cores" + (omp ? std::string(", OMP_NUM_THREADS=") + omp : ""),
                  cores > 0 ? "" : "the core count is unknown; set OMP_NUM_THREADS", ""});
  const MemoryInfo m = cpu_device().memory_info();
  rows.push_back({"devices: memory", Status::Pass,
                  gib(static_cast<double>(m.total_bytes)) + " total, " +
                      gib(static_cast<double>(available_memory_bytes())) + " available",
                  "", ""});
  std::string backends;
  for (const std::string& b : device_backends()) backends += (backends.empty() ? "" : ", ") + b;
  rows.push_back({"devices: backends", Status::Info, "built: " + backends + " (--device chooses)", "", ""});
  const std::string versions = std::string("tessera ") + TESSERA_VERSION + ", " +
                               ops::kernels_for(cpu_device()).libraries() +
                               ", Gloo (libgloo, linked)";  // CUDA and NCCL: the backend's rows
  rows.push_back({"build: versions", Status::Pass, versions, "", ""});
  char hash[40];
  std::snprintf(hash, sizeof hash, "%016llx", static_cast<unsigned long long>(build_hash));
  rows.push_back({"build: binary", build_hash ? Status::Pass : Status::Warn,
                  build_hash ? std::string("/proc/self/exe hash ") + hash : "cannot read /proc/self/exe",
                  build_hash ? "" : "run the doctor from a normal file system", ""});
  return rows;
}

std::vector<Row> check_interfaces(const std::string& gloo_ifname, const std::optional<std::string>& nccl_ifname,
                                  const std::string& master_addr, int master_port, int num_nodes) {
  std::vector<Row> rows;
  const std::vector<NetInterface> all = list_net_interfaces();
  Row r{"environment: interface", Status::Pass, "", "", ""};
  try {
    InterfaceChoice c = choose_interface(gloo_ifname, master_addr, master_port);
    r.detail = c.name + " " + c.ipv4 + " (" + c.reason + ")";
    bool loopback = false;
    for (const NetInterface& i : all)
      if (i.name == c.name) loopback = i.loopback;
    if (loopback && num_nodes > 1) {
      r.status = Status::Fail;
      r.detail += "; the loopback cannot reach other nodes";
      r.fix =
          "set GLOO_SOCKET_IFNAME to the NIC that reaches MASTER_ADDR (one of: " + describe_net_interfaces(all) + ")";
    } else if (!gloo_ifname.empty() && !master_addr.empty()) {
      // The named interface should be the one that routes to the master.
      try {
        InterfaceChoice route = choose_interface("", master_addr, master_port);
        if (route.name != c.name && !loopback) {
          bool master_local = false;
          for (const NetInterface& i : all)
            for (const std::string& a : i.ipv4) master_local |= a == master_addr || master_addr.rfind("127.", 0) == 0;
          if (!master_local) {
            r.status = Status::Warn;
            r.detail += "; but the route to MASTER_ADDR " + master_addr + " leaves through " + route.name;
            r.fix = "check GLOO_SOCKET_IFNAME=" + gloo_ifname + ": traffic to the master uses " + route.name;
          }
        }
      } catch (const Error&) {
      }
    }
  } catch (const Error& e) {
    r.status = Status::Fail;
    r.detail = e.what();
    r.fix = e.hint().empty()
                ? "set GLOO_SOCKET_IFNAME to an interface with an IPv4 address: " + describe_net_interfaces(all)
                : e.hint();
  }
  rows.push_back(r);
  if (nccl_ifname) {
    // NCCL's syntax: a comma list of prefixes, "=" for exact names, a leading "^" to exclude.
    std::string spec = *nccl_ifname;
    bool exclude = !spec.empty() && spec[0] == '^';
    if (exclude) spec = spec.substr(1);
    bool exact = !spec.empty() && spec[0] == '=';
    if (exact) spec = spec.substr(1);
    bool matched = false;
    size_t a = 0;
    while (a <= spec.size()) {
      size_t b = spec.find(',', a);
      std::string name = spec.substr(a, b == std::string::npos ? std::string::npos : b - a);
      for (const NetInterface& i : all)
        if (!name.empty() && (exact ? i.name == name : i.name.rfind(name, 0) == 0)) matched = true;
      if (b == std::string::npos) break;
      a = b + 1;
    }
    Row n{"environment: NCCL_SOCKET_IFNAME", Status::Pass, "NCCL_SOCKET_IFNAME=" + *nccl_ifname, "", ""};
    if (!exclude && !matched) {
      n.status = Status::Warn;  // NCCL is not used by the CPU build; wrong for a later CUDA run
      n.detail += " matches no interface here";
      n.fix = "use one of: " + describe_net_interfaces(all);
    } else {
      n.detail += exclude ? " (exclusion list)" : " matches an interface";
    }
    rows.push_back(n);
  }
  return rows;
}

Row probe_tcp(const std::string& label, const std::string& host, int port, double timeout_seconds) {
  Row r{label, Status::Pass, "", "", ""};
  const std::string where = host + ":" + std::to_string(port);
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  if (int rc = getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &res); rc != 0 || !res) {
    r.status = Status::Fail;
    r.detail = "cannot resolve " + host + ": " + gai_strerror(rc);
    r.fix = "set MASTER_ADDR to node 0's IPv4 address (--master_addr of tessera launch)";
    return r;
  }
  const auto start = std::chrono::steady_clock::now();
  const auto deadline = start + std::chrono::duration<double>(timeout_seconds);
  std::string last = "timed out";
  int attempts = 0;
  for (;;) {
    ++attempts;
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    const auto t0 = std::chrono::steady_clock::now();
    int rc = connect(fd, res->ai_addr, res->ai_addrlen);
    int err = rc == 0 ? 0 : errno;
    if (rc != 0 && err == EINPROGRESS) {
      pollfd p{fd, POLLOUT, 0};
      const auto left =
          std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
      int pr = poll(&p, 1, static_cast<int>(std::max<int64_t>(1, left.count())));
      if (pr == 1) {
        socklen_t len = sizeof err;
        getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len);
      } else {
        err = ETIMEDOUT;
      }
    }
    const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    close(fd);
    if (err == 0) {
      char b[120];
      std::snprintf(b, sizeof b, "%s reachable, connect %.2f ms", where.c_str(), ms);
      r.detail = b;
      if (attempts > 1) r.detail += " (after " + std::to_string(attempts) + " attempts)";
      freeaddrinfo(res);
      return r;
    }
    last = std::strerror(err);
    if (std::chrono::steady_clock::now() + std::chrono::milliseconds(200) >= deadline) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
  freeaddrinfo(res);
  char b[64];
  std::snprintf(b, sizeof b, "%.1f s", timeout_seconds);
  r.status = Status::Fail;
  r.detail = where + " unreachable: " + last + " (" + std::to_string(attempts) + " attempts in " + b + ")";
  r.fix =
      "start node 0 first; check MASTER_ADDR/MASTER_PORT on every node, the firewall between the nodes "
      "(ping and `nc -z " +
      host + " " + std::to_string(port) + "`), and that the port is free on node 0";
  return r;
}

DataPlan data_plan(const ParsedOptions& p) {
  DataPlan plan;
  plan.mock = p.get_bool("--mock-data");
  auto add = [&](const data::Blend& b) {
    for (const std::string& s : b.prefixes) plan.prefixes.push_back(s);
  };
  if (p.given("--data-path")) add(data::blend_from_list(p.get_list("--data-path")));
  if (auto f = p.raw("--data-args-path")) add(data::blend_from_file(*f));
  plan.split_prefixes = plan.prefixes.size();
  plan.split = p.raw("--split").value_or("969, 30, 1");
  for (const char* flag : {"--train-data-path", "--valid-data-path", "--test-data-path"})
    if (p.given(flag)) add(data::blend_from_list(p.get_list(flag), flag));
  if (auto c = p.raw("--data-cache-path")) {
    plan.cache_dir = *c;
  } else if (!plan.prefixes.empty()) {
    plan.cache_dir = plan.prefixes[0] + "/cache/GPTDataset_indices";  // Megatron's default (a quirk)
  }
  return plan;
}

namespace {

// The data's token ids against the model's vocabulary (data/token_id_range.h says what it costs).
void check_token_ids(const data::IndexedDataset& ds, const VocabularyLimit& vocab, Row& r) {
  const data::TokenIdRange ids = data::token_id_range(ds, vocab.padded_size);
  const std::string problem = data::token_id_problem(ds, ids, vocab.padded_size, vocab.description);
  if (!problem.empty()) {
    r.status = Status::Fail;
    r.detail += "; " + problem;
    r.fix = data::kTokenIdHint;
  } else if (ids.scanned) {
    r.detail += "; ids " + std::to_string(ids.min_id) + ".." + std::to_string(ids.max_id) +
                " fit the padded vocabulary of " + std::to_string(vocab.padded_size);
  } else {
    r.detail += "; its dtype keeps the ids below the padded vocabulary of " + std::to_string(vocab.padded_size);
  }
}

}  // namespace

std::vector<Row> check_data(const ParsedOptions& p, const DataPlan& plan, const std::optional<VocabularyLimit>& vocab) {
  std::vector<Row> rows;
  if (plan.prefixes.empty()) {
    if (auto f = p.raw("--per-split-data-args-path")) {
      rows.push_back(
          {"data: prefixes", Status::Warn, "--per-split-data-args-path " + *f + " is not inspected yet",
           "list the prefixes with --train-data-path/--valid-data-path/--test-data-path to have them checked", ""});
    } else {
      rows.push_back({"data: prefixes", Status::Info,
                      plan.mock ? "--mock-data: no files to check" : "no data flags (train uses mock data)", "", ""});
    }
    return rows;
  }
  std::optional<data::SplitMatrix> splits;
  if (plan.split_prefixes) {
    try {
      splits = data::split_matrix_from_string(plan.split);
    } catch (const Error& e) {
      rows.push_back({"data: --split", Status::Fail, e.what(), "--split takes three weights, e.g. 949,50,1", ""});
    }
  }
  for (size_t k = 0; k < plan.prefixes.size(); ++k) {
    const std::string& prefix = plan.prefixes[k];
    Row r{"data: " + prefix, Status::Pass, "", "", ""};
    std::string problem;
    for (const char* ext : {".idx", ".bin"}) {
      const std::string f = prefix + ext;
      struct stat st {};
      if (stat(f.c_str(), &st) != 0) {
        problem += (problem.empty() ? "" : "; ") + f + ": " + std::strerror(errno);
      } else if (!S_ISREG(st.st_mode)) {
        problem += (problem.empty() ? "" : "; ") + f + " is not a regular file";
      } else if (int fd = open(f.c_str(), O_RDONLY | O_CLOEXEC); fd < 0) {
        problem += (problem.empty() ? "" : "; ") + f + " is not readable: " + std::strerror(errno);
      } else {
        close(fd);
      }
    }
    if (!problem.empty()) {
      r.status = Status::Fail;
      r.detail = problem;
      r.fix = data::dataset_prefix_hint(prefix) + "; or copy the files to this node";
      rows.push_back(r);
      continue;
    }
    try {
      data::IndexedDataset ds(prefix);
      r.detail = std::to_string(ds.document_count()) + " documents, " + std::to_string(ds.sequence_count()) +
                 " sequences, " + std::to_string(ds.token_count()) + " tokens (" +
                 std::string(data::dtype_name(ds.dtype())) + ")";
      if (vocab) check_token_ids(ds, *vocab, r);
      // Every split with a share needs more than one token (train's GPTDataset refuses less).
      if (k < plan.split_prefixes && splits) {
        for (data::Split sp : data::kAllSplits) {
          const auto& bookend = (*splits)[static_cast<int>(sp)];
          if (!bookend) continue;
          auto [begin, end] = data::split_range(*bookend, static_cast<int64_t>(ds.sequence_count()));
          int64_t tokens = 0;
          for (int64_t i = begin; i < end; ++i) tokens += ds.sequence_length(static_cast<uint64_t>(i));
          if (tokens <= 1) {
            r.status = Status::Fail;
            r.detail += "; the " + std::string(data::split_name(sp)) + " split (--split " + plan.split + ") holds " +
                        std::to_string(tokens) + " tokens (sequences [" + std::to_string(begin) + ", " +
                        std::to_string(end) + "))";
            r.fix =
                "train needs more than one token in every split: give it a larger share with --split or use a "
                "larger dataset";
          }
        }
      }
    } catch (const Error& e) {
      r.status = Status::Fail;
      r.detail = "invalid: " + std::string(e.what());
      r.fix = "rebuild it with `tessera preprocess` (a copy may be truncated: compare sizes with the source)";
    }
    rows.push_back(r);
  }
  if (!plan.cache_dir.empty()) {
    Row w = check_writable("data: cache folder", plan.cache_dir, "--data-cache-path");
    rows.push_back(w);
    Row c{"data: caches", Status::Info, "", "", ""};
    int npy = 0;
    if (DIR* d = opendir(plan.cache_dir.c_str())) {
      while (dirent* e = readdir(d)) {
        std::string n = e->d_name;
        if (n.size() > 4 && n.compare(n.size() - 4, 4, ".npy") == 0) ++npy;
      }
      closedir(d);
    }
    c.detail = npy ? std::to_string(npy) + " index files in " + plan.cache_dir + " (reused when they match)"
                   : "none yet in " + plan.cache_dir + " (built at the first run)";
    rows.push_back(c);
  }
  return rows;
}

Row check_tokenizer(const ParsedOptions& p) {
  data::TokenizerOptions o;
  o.type = p.raw("--tokenizer-type").value_or("GPT2BPETokenizer");
  o.vocab_file = p.get_string("--vocab-file");
  o.merge_file = p.get_string("--merge-file");
  o.tokenizer_model = p.get_string("--tokenizer-model");
  if (p.raw("--vocab-size")) o.vocab_size = p.get_int("--vocab-size");
  Row r{"data: tokenizer", Status::Pass, "", "", ""};
  std::string missing;
  for (const auto& [flag, f] :
       {std::pair<std::string, std::string>{"--vocab-file", o.vocab_file}, {"--merge-file", o.merge_file}}) {
    if (f.empty()) continue;
    struct stat st {};
    if (stat(f.c_str(), &st) != 0 || !S_ISREG(st.st_mode))
      missing += (missing.empty() ? "" : "; ") + flag + " " + f + ": " +
                 (errno == 0 || S_ISDIR(st.st_mode) ? "not a regular file" : std::strerror(errno));
  }
  if (!missing.empty()) {
    r.status = Status::Fail;
    r.detail = missing;
    r.fix =
        "GPT-2 BPE needs vocab.json and merges.txt (the two-server guide's gpt2-vocab.json, gpt2-merges.txt) "
        "on every node at the same path";
    return r;
  }
  try {
    auto t = data::build_tokenizer(o);
    r.detail =
        std::string(t->type()) + ", " + std::to_string(t->vocab_size()) + " tokens, EOD " + std::to_string(t->eod());
    if (o.type == "GPT2BPETokenizer" && o.vocab_size && *o.vocab_size != t->vocab_size()) {
      r.status = Status::Warn;
      r.detail += "; --vocab-size " + std::to_string(*o.vocab_size) + " is ignored by GPT2BPETokenizer";
      r.fix = "drop --vocab-size (the vocabulary comes from --vocab-file)";
    }
  } catch (const Error& e) {
    r.status = Status::Fail;
    r.detail = e.what();
    r.fix = e.hint().empty() ? "check --tokenizer-type, --vocab-file, --merge-file and --vocab-size" : e.hint();
  }
  return r;
}

Row check_writable(const std::string& label, const std::string& dir, const std::string& flag) {
  Row r{label, Status::Pass, "", "", ""};
  try {
    check_folder_writable(dir, flag);  // the same check `train` makes at start-up
  } catch (const Error& e) {
    r.status = Status::Fail;
    r.detail = e.what();
    r.fix = e.hint() + ", on every node";
    return r;
  }
  const std::string at = existing_parent(dir);
  r.detail = dir + (at == dir ? " is writable" : " will be created under " + at + " (writable)");
  return r;
}

Row check_disk(const std::string& label, const std::string& path, uint64_t min_free_bytes) {
  Row r{label, Status::Pass, "", "", ""};
  const std::string at = existing_parent(path);
  struct statvfs s {};
  if (statvfs(at.c_str(), &s) != 0) {
    r.status = Status::Warn;
    r.detail = "cannot stat " + at + ": " + std::strerror(errno);
    r.fix = "check the path";
    return r;
  }
  const uint64_t free_bytes = static_cast<uint64_t>(s.f_bavail) * s.f_frsize;
  r.detail = at + ": " + gib(static_cast<double>(free_bytes)) + " free of " +
             gib(static_cast<double>(s.f_blocks) * s.f_frsize) + " (needs " + mib(static_cast<double>(min_free_bytes)) +
             ")";
  if (free_bytes < min_free_bytes) {
    r.status = Status::Fail;
    r.detail = at + ": only " + mib(static_cast<double>(free_bytes)) + " free, needs " +
               mib(static_cast<double>(min_free_bytes));
    r.fix =
        "free space on that file system, move the folder (--data-cache-path) elsewhere, or lower "
        "--min-free-disk-gb if you know less is enough";
  }
  return r;
}

Row check_memory(const std::vector<RankMemory>& ranks, const std::vector<int>& node_ranks, const MemoryInfo& memory,
                 uint64_t available, int micro_batch, int num_layers, int hidden_size) {
  Row r{"config: memory", Status::Pass, "", "", ""};
  const RankMemory& top = largest_rank_memory(ranks);
  const GPTMemoryEstimate& e = top.estimate;
  double node = 0;
  for (int rank : node_ranks) node += static_cast<double>(ranks.at(rank).estimate.total_bytes());
  bool uniform = true;
  for (const RankMemory& m : ranks) uniform &= m.estimate.total_bytes() == e.total_bytes();
  const std::string which = uniform ? "per rank" : "per rank up to";
  const std::string where = uniform ? "" : " (rank " + std::to_string(top.rank) + ": tensor " +
                                               std::to_string(top.tp_rank) + ", pipeline " +
                                               std::to_string(top.pp_rank) + ")";
  const int local = static_cast<int>(node_ranks.size());
  char b[512];
  std::snprintf(b, sizeof b,
                "%.3g parameters on the largest rank; %s %s%s (parameters %s, gradients %s, main parameters %s, Adam %s, "
                "activations %s "
                "at micro-batch %d); %d process%s on this node = %s; %s total, %s available",
                static_cast<double>(e.num_parameters), which.c_str(), gib(static_cast<double>(e.total_bytes())).c_str(),
                where.c_str(), gib(e.parameter_bytes).c_str(), gib(e.gradient_bytes).c_str(),
                gib(e.main_parameter_bytes).c_str(), gib(e.optimizer_bytes).c_str(), gib(e.activation_bytes).c_str(), micro_batch, local,
                local > 1 ? "es" : "", gib(node).c_str(), gib(static_cast<double>(memory.total_bytes)).c_str(),
                gib(static_cast<double>(available)).c_str());
  r.detail = b;
  if (e.expert_parameters > 0) {  // the experts' share (per EP rank) and expert parallelism's dispatcher buffers
    std::snprintf(b, sizeof b, "; of which %.3g expert parameters and %s MoE dispatcher buffers",
                  static_cast<double>(e.expert_parameters), gib(e.moe_dispatch_bytes).c_str());
    r.detail += b;
  }
  const std::string help = "lower --micro-batch-size (activations), then --num-layers (" + std::to_string(num_layers) +
                           ") or --hidden-size (" + std::to_string(hidden_size) +
                           "), or run fewer processes per node (--nproc_per_node)";
  if (node > static_cast<double>(memory.total_bytes)) {
    r.status = Status::Fail;
    r.fix = help;
  } else if (node > static_cast<double>(available)) {
    r.status = Status::Warn;
    r.fix = "more than is available now (other processes hold memory); " + help;
  }
  return r;
}

Row check_load(const std::string& dir, const GPTConfig* config, uint64_t available_bytes) {
  Row r{"checkpoints: --load", Status::Pass, "", "", ""};
  struct stat st {};
  if (dir.empty() || stat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
    r.status = Status::Warn;
    r.detail = "--load " + dir + " is not a folder: training starts from scratch";
    r.fix = "check the path if you meant to resume";
    return r;
  }
  std::optional<int64_t> latest;
  try {
    latest = latest_checkpoint_iteration(dir);
  } catch (const Error& e) {
    r.status = Status::Fail;
    r.detail = e.what();
    r.fix = e.hint().empty() ? "fix or remove the tracker latest_checkpointed_iteration.txt" : e.hint();
    return r;
  }
  if (!latest) {
    r.status = Status::Info;
    r.detail = dir + " holds no checkpoint yet: training starts from scratch";
    return r;
  }
  r.detail = *latest == kReleaseIteration ? std::string("a release checkpoint (Megatron's converter: the model alone, "
                                                        "training starts at iteration 0)")
                                           : "latest iteration " + std::to_string(*latest);
  if (!config) {
    r.status = Status::Warn;
    r.detail += "; not loaded (the flags did not parse)";
    r.fix = "fix the flags (config: flags) and run again";
    return r;
  }
  const GPTMemoryEstimate e = estimate_gpt_memory(*config, 1);
  if (2 * e.parameter_bytes > available_bytes / 4) {
    r.status = Status::Info;
    r.detail += "; not loaded here (" + gib(static_cast<double>(e.parameter_bytes)) +
                " of parameters is too much for a check): `tessera ckpt inspect " + dir + "` verifies its checksums";
    return r;
  }
  try {
    SlabBuilder layout;
    const std::vector<ParamSpec> specs = gpt_param_specs(*config);
    std::vector<size_t> offsets;
    for (const ParamSpec& s : specs) offsets.push_back(layout.reserve(DType::F32, s.shape));
    Buffer slab(cpu_device(), layout.total_bytes());
    std::vector<NamedTensor> model;
    for (size_t i = 0; i < specs.size(); ++i)
      model.push_back({specs[i].name, tensor_at(slab, offsets[i], DType::F32, specs[i].shape)});
    CheckpointState state = load_checkpoint(dir, *latest, model, {}, false);
    r.detail += ": checksums and " + std::to_string(specs.size()) + " parameter shapes match these flags (" +
                std::to_string(state.consumed_train_samples) + " samples consumed)";
  } catch (const Error& e) {
    r.status = Status::Fail;
    r.detail += ": " + std::string(e.what());
    r.fix = e.hint().empty() ? "load with the flags the checkpoint was saved with (`tessera ckpt inspect " + dir +
                                   "` lists them), or point --load elsewhere"
                             : e.hint();
  }
  return r;
}

}  // namespace tessera::doctor
