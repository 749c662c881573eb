#include "tessera/launch/launch_options.h"

#include <dirent.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <algorithm>
#include <cctype>

#include "tessera/core/error.h"

namespace tessera::launch {
namespace {

const char* kHelpHint = "see `tessera launch --help`";

int to_int(const std::string& flag, const std::string& v, int lo, int hi) {
  errno = 0;
  char* end = nullptr;
  long x = std::strtol(v.c_str(), &end, 10);
  if (v.empty() || *end != '\0' || errno == ERANGE || x < lo || x > hi)
    throw usage_error(flag + " expects an integer in " + std::to_string(lo) + ".." + std::to_string(hi) +
                          ", got '" + v + "'",
                      kHelpHint);
  return static_cast<int>(x);
}

double to_seconds(const std::string& flag, const std::string& v) {
  char* end = nullptr;
  double x = std::strtod(v.c_str(), &end);
  if (v.empty() || *end != '\0' || !std::isfinite(x) || x < 0)
    throw usage_error(flag + " expects a number of seconds, got '" + v + "'", kHelpHint);
  return x;
}

int cpu_count() {
  long n = ::sysconf(_SC_NPROCESSORS_ONLN);
  return n > 0 ? static_cast<int>(n) : 1;
}

void set_nproc(LaunchOptions& o, const std::string& f, const std::string& v) {
  if (v == "cpu") {
    o.nproc_per_node = cpu_count();
  } else if (v == "gpu" || v == "auto") {
    int gpus = visible_gpu_count();
    if (gpus == 0 && v == "gpu")
      throw usage_error(f + " gpu: no NVIDIA GPU is visible to this process",
                        "pass a number of processes, or `cpu`; check nvidia-smi and CUDA_VISIBLE_DEVICES");
    o.nproc_per_node = gpus > 0 ? gpus : cpu_count();
  } else {
    o.nproc_per_node = to_int(f, v, 1, 4096);
  }
}

void set_nnodes(LaunchOptions& o, const std::string& f, const std::string& v) {
  auto colon = v.find(':');
  if (colon == std::string::npos) {
    o.nnodes = to_int(f, v, 1, 65536);
    return;
  }
  int lo = to_int(f, v.substr(0, colon), 1, 65536);
  int hi = to_int(f, v.substr(colon + 1), 1, 65536);
  if (lo != hi)
    throw usage_error(f + " " + v + ": elastic node ranges are not supported",
                      "give a fixed number of nodes, e.g. " + f + " " + std::to_string(hi));
  o.nnodes = lo;
}

bool to_bool(const std::string& flag, const std::string& v) {
  std::string s;
  for (char c : v) s += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (s == "1" || s == "true" || s == "yes" || s == "y") return true;
  if (s == "0" || s == "false" || s == "no" || s == "n") return false;
  throw usage_error(flag + " expects true or false, got '" + v + "'", kHelpHint);
}

void set_rdzv_conf(LaunchOptions& o, const std::string& f, const std::string& v) {
  size_t pos = 0;
  while (pos < v.size()) {
    size_t comma = v.find(',', pos);
    std::string item = v.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos);
    pos = comma == std::string::npos ? v.size() : comma + 1;
    if (item.empty()) continue;
    auto eq = item.find('=');
    if (eq == std::string::npos)
      throw usage_error(f + " expects key=value pairs separated by commas, got '" + item + "'",
                        "e.g. " + f + " join_timeout=900");
    std::string key = item.substr(0, eq), value = item.substr(eq + 1);
    if (key == "join_timeout" || key == "timeout") {
      o.join_timeout_s = to_seconds(f + " " + key, value);
      if (o.join_timeout_s <= 0) throw usage_error(f + " " + key + " must be positive", kHelpHint);
    } else if (key == "keep_alive_interval") {
      o.keep_alive_interval_s = to_seconds(f + " " + key, value);
      if (o.keep_alive_interval_s <= 0) throw usage_error(f + " " + key + " must be positive", kHelpHint);
    } else if (key == "keep_alive_max_attempt") {
      o.keep_alive_max_attempt = to_int(f + " " + key, value, 1, 1000000);
    } else if (key == "is_host") {
      o.is_host = to_bool(f + " is_host", value);
    } else if (key == "last_call_timeout" || key == "close_timeout" || key == "read_timeout" ||
               key == "use_libuv") {
      // torchrun's; nothing here depends on them.
    } else {
      std::fprintf(stderr, "tessera launch: note: ignoring unknown --rdzv_conf key '%s'\n", key.c_str());
    }
  }
}

void set_stream_bits(int& out, const std::string& f, const std::string& v) {
  if (v.find(':') != std::string::npos)
    throw usage_error(f + " " + v + ": per-rank settings are not supported", "give one of 0, 1, 2, 3 for all ranks");
  out = to_int(f, v, 0, 3);
}

void set_filter(LaunchOptions& o, const std::string& f, const std::string& v) {
  o.local_ranks_filter.clear();
  size_t pos = 0;
  while (pos <= v.size()) {
    size_t comma = v.find(',', pos);
    std::string item = v.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos);
    o.local_ranks_filter.insert(to_int(f, item, 0, 1 << 20));
    if (comma == std::string::npos) break;
    pos = comma + 1;
  }
}

struct Flag {
  const char* name;        // canonical, dashed
  const char* short_name;  // "-r" or nullptr
  const char* metavar;     // nullptr: a switch
  const char* default_text;
  const char* help;
  void (*apply)(LaunchOptions&, const std::string& flag, const std::string& value);
};

const Flag kFlags[] = {
    {"--nproc-per-node", nullptr, "N", "1", "worker processes on this node: a number, `cpu` (one per CPU), `gpu` or `auto` (one per visible GPU, else per CPU)", set_nproc},
    {"--nnodes", nullptr, "N", "1", "number of nodes (N, or N:N; elastic ranges are not supported)", set_nnodes},
    {"--node-rank", nullptr, "R", "0", "this node's rank, 0..nnodes-1; with --rdzv-backend c10d it may be left out: the store's host is node 0, the others are numbered in order of arrival",
     [](LaunchOptions& o, const std::string& f, const std::string& v) { o.node_rank = to_int(f, v, 0, 65535); }},
    {"--master-addr", nullptr, "ADDR", "$MASTER_ADDR, else 127.0.0.1", "address of node 0, where the rendezvous store is served; must be reachable from every node",
     [](LaunchOptions& o, const std::string& f, const std::string& v) {
       if (v.empty()) throw usage_error(f + " must not be empty", kHelpHint);
       o.master_addr = v;
     }},
    {"--master-port", nullptr, "PORT", "$MASTER_PORT, else 29500",
     "TCP port of the rendezvous store on node 0 (workers see it as MASTER_PORT); 0 (one node only): a free port, "
     "bound once and passed on",
     [](LaunchOptions& o, const std::string& f, const std::string& v) { o.master_port = to_int(f, v, 0, 65535); }},
    {"--standalone", nullptr, nullptr, nullptr, "one node, the store on 127.0.0.1 at a free port, a random run id: for several jobs on one machine",
     [](LaunchOptions& o, const std::string&, const std::string&) { o.standalone = true; }},
    {"--rdzv-backend", nullptr, "NAME", "static", "static or c10d; both rendezvous through tessera's store",
     [](LaunchOptions& o, const std::string& f, const std::string& v) {
       if (v != "static" && v != "c10d")
         throw usage_error(f + " " + v + " is not supported", "use static or c10d (etcd is not supported)");
       o.rdzv_backend = v;
     }},
    {"--rdzv-endpoint", nullptr, "HOST[:PORT]", nullptr, "the store's address (port 29400 when left out); replaces --master-addr/--master-port",
     [](LaunchOptions& o, const std::string&, const std::string& v) { o.rdzv_endpoint = v; }},
    {"--rdzv-id", nullptr, "ID", "none", "the job's id: the same on every node, different for every job (e.g. $SLURM_JOB_ID); workers see it as TORCHELASTIC_RUN_ID",
     [](LaunchOptions& o, const std::string& f, const std::string& v) {
       if (v.empty()) throw usage_error(f + " must not be empty", kHelpHint);
       o.rdzv_id = v;
     }},
    {"--rdzv-conf", nullptr, "K=V,...", "join_timeout=600", "join_timeout (seconds all nodes have to join), keep_alive_interval (5) and keep_alive_max_attempt (3): a node silent for their product is taken as gone; is_host=true|false", set_rdzv_conf},
    {"--max-restarts", nullptr, "N", "0", "restart every node's workers together up to N times after a failure",
     [](LaunchOptions& o, const std::string& f, const std::string& v) { o.max_restarts = to_int(f, v, 0, 1000000); }},
    {"--monitor-interval", nullptr, "SECONDS", "0.1", "how often workers and other nodes are checked (0.05..5)",
     [](LaunchOptions& o, const std::string& f, const std::string& v) {
       o.monitor_interval_s = std::min(5.0, std::max(0.05, to_seconds(f, v)));
     }},
    {"--signal-grace-seconds", nullptr, "SECONDS", "30", "after SIGINT/SIGTERM/SIGHUP/SIGQUIT, how long workers have to finish (e.g. a save on signal) before SIGKILL; a second signal kills at once",
     [](LaunchOptions& o, const std::string& f, const std::string& v) { o.signal_grace_s = to_seconds(f, v); }},
    {"--failure-grace-seconds", nullptr, "SECONDS", "3", "after a worker failed, how long the others have after SIGTERM before SIGKILL",
     [](LaunchOptions& o, const std::string& f, const std::string& v) { o.failure_grace_s = to_seconds(f, v); }},
    {"--log-dir", nullptr, "DIR", nullptr, "also write each worker's output to DIR/attempt_<n>/<rank>/stdout.log and stderr.log",
     [](LaunchOptions& o, const std::string& f, const std::string& v) {
       if (v.empty()) throw usage_error(f + " must not be empty", kHelpHint);
       o.log_dir = v;
     }},
    {"--redirects", "-r", "0-3", "0", "with --log-dir, send stdout (1), stderr (2) or both (3) only to the files, not to the console",
     [](LaunchOptions& o, const std::string& f, const std::string& v) { set_stream_bits(o.redirects, f, v); }},
    {"--tee", "-t", "0-3", "0", "accepted for torchrun scripts: with --log-dir, output goes to the files and the console unless --redirects says otherwise",
     [](LaunchOptions& o, const std::string& f, const std::string& v) { set_stream_bits(o.tee, f, v); }},
    {"--prefix", nullptr, "auto|always|never", "auto", "start each line of worker output with \"[rank<N>]: \" (auto: when the job has more than one worker)",
     [](LaunchOptions& o, const std::string& f, const std::string& v) {
       if (v == "auto") o.prefix = PrefixMode::Auto;
       else if (v == "always") o.prefix = PrefixMode::Always;
       else if (v == "never") o.prefix = PrefixMode::Never;
       else throw usage_error(f + " expects auto, always or never, got '" + v + "'", kHelpHint);
     }},
    {"--local-ranks-filter", nullptr, "R,...", nullptr, "show only these local ranks' output on the console (files and failure reports keep all)", set_filter},
    {"--role", nullptr, "NAME", "default", "workers see it as ROLE_NAME",
     [](LaunchOptions& o, const std::string&, const std::string& v) { o.role = v; }},
    {"--local-addr", nullptr, "ADDR", "the host name", "this node's name in messages to the other nodes",
     [](LaunchOptions& o, const std::string&, const std::string& v) { o.local_addr = v; }},
    {"--no-python", nullptr, nullptr, nullptr, "run a program ending in .py as an executable instead of with python3",
     [](LaunchOptions& o, const std::string&, const std::string&) { o.no_python = true; }},
    {"--module", "-m", nullptr, nullptr, "the program is a Python module, run as `python3 -m MODULE`",
     [](LaunchOptions& o, const std::string&, const std::string&) { o.module = true; }},
    {"--start-method", nullptr, "METHOD", "spawn", "accepted for torchrun scripts; workers are always forked and executed",
     [](LaunchOptions&, const std::string& f, const std::string& v) {
       if (v != "spawn" && v != "fork" && v != "forkserver")
         throw usage_error(f + " expects spawn, fork or forkserver, got '" + v + "'", kHelpHint);
     }},
    {"--run-path", nullptr, nullptr, nullptr, "accepted for torchrun scripts; no effect",
     [](LaunchOptions&, const std::string&, const std::string&) {}},
    {"--use-env", nullptr, nullptr, nullptr, "accepted for torch.distributed.launch scripts; workers always get LOCAL_RANK",
     [](LaunchOptions&, const std::string&, const std::string&) {}},
    {"--logs-specs", nullptr, "NAME", nullptr, "not supported",
     [](LaunchOptions&, const std::string& f, const std::string&) {
       throw usage_error(f + " is not supported", "use --log-dir, --redirects and --local-ranks-filter");
     }},
    {"--help", "-h", nullptr, nullptr, "show this help",
     [](LaunchOptions& o, const std::string&, const std::string&) { o.help = true; }},
};

std::string normalize(const std::string& flag) {
  std::string s = flag;
  for (size_t i = 2; i < s.size(); ++i)
    if (s[i] == '_') s[i] = '-';
  return s;
}

const Flag& find_flag(const std::string& given) {
  if (given.rfind("--", 0) != 0) {
    for (const auto& f : kFlags)
      if (f.short_name && given == f.short_name) return f;
    throw usage_error("unknown flag " + given, kHelpHint);
  }
  std::string name = normalize(given);
  for (const auto& f : kFlags)
    if (name == f.name) return f;
  const Flag* match = nullptr;
  int matches = 0;
  std::string candidates;
  for (const auto& f : kFlags) {
    if (name.size() <= 2 || std::string(f.name).rfind(name, 0) != 0) continue;
    candidates += (candidates.empty() ? "" : ", ") + std::string(f.name);
    match = &f;
    ++matches;
  }
  if (matches == 1) return *match;
  if (matches > 1) throw usage_error("ambiguous flag " + given + " could be " + candidates, kHelpHint);
  throw usage_error("unknown flag " + given,
                    "`tessera launch` flags come before the program; see `tessera launch --help`");
}

}  // namespace

int visible_gpu_count() {
  int gpus = 0;
  if (DIR* d = ::opendir("/proc/driver/nvidia/gpus")) {
    while (dirent* e = ::readdir(d))
      if (e->d_name[0] != '.') ++gpus;
    ::closedir(d);
  }
  if (const char* visible = std::getenv("CUDA_VISIBLE_DEVICES")) {
    std::string v = visible;
    int listed = v.empty() ? 0 : 1;
    for (char c : v) listed += c == ',';
    gpus = std::min(gpus, listed);
  }
  return gpus;
}

LaunchOptions parse_launch_options(int argc, char** argv) {
  LaunchOptions o;
  if (const char* a = std::getenv("MASTER_ADDR"); a && *a) o.master_addr = a;
  if (const char* p = std::getenv("MASTER_PORT"); p && *p) o.master_port = to_int("MASTER_PORT", p, 0, 65535);
  bool node_rank_given = false;

  int i = 0;
  for (; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--") {
      ++i;
      break;
    }
    if (a.size() < 2 || a[0] != '-') break;  // the program
    std::string value;
    bool has_value = false;
    if (auto eq = a.find('='); eq != std::string::npos && a.rfind("--", 0) == 0) {
      value = a.substr(eq + 1);
      a = a.substr(0, eq);
      has_value = true;
    }
    const Flag& f = find_flag(a);
    if (!f.metavar) {
      if (has_value) throw usage_error(std::string(f.name) + " takes no value", kHelpHint);
    } else if (!has_value) {
      if (i + 1 >= argc) throw usage_error(std::string(f.name) + " expects a value (" + f.metavar + ")", kHelpHint);
      value = argv[++i];
    }
    f.apply(o, f.name, value);
    if (std::string(f.name) == "--node-rank") node_rank_given = true;
    if (o.help) return o;
  }
  for (; i < argc; ++i) o.program.emplace_back(argv[i]);

  if (o.program.empty())
    throw usage_error("no program to launch",
                      "e.g. tessera launch --nproc_per_node 2 tessera train --mock-data ... "
                      "(a bare subcommand such as `train` runs this tessera)");
  if (o.standalone) {
    if (o.nnodes != 1)
      throw usage_error("--standalone runs one node, but --nnodes " + std::to_string(o.nnodes) + " was given",
                        "drop --standalone and give --master_addr/--master_port (or --rdzv_endpoint) on every node");
    o.rdzv_backend = "c10d";
    o.rdzv_endpoint = "127.0.0.1:0";
    o.node_rank = 0;
  }
  if (o.node_rank && *o.node_rank >= o.nnodes)
    throw usage_error("--node_rank " + std::to_string(*o.node_rank) + " is outside 0.." + std::to_string(o.nnodes - 1) +
                          " (--nnodes " + std::to_string(o.nnodes) + ")",
                      "node ranks count from 0 on the node that serves the store");
  if (!node_rank_given && !o.node_rank && (o.rdzv_backend == "static" || o.nnodes == 1)) o.node_rank = 0;
  if ((o.redirects || o.tee) && o.log_dir.empty())
    throw usage_error("--redirects and --tee need --log-dir", "e.g. --log-dir logs --redirects 3");
  Endpoint e = store_endpoint(o);
  if (e.port == 0 && o.nnodes > 1)
    throw usage_error("port 0 (a free port) only works on one node",
                      "give every node the same --master_port, e.g. 29500");
  return o;
}

Endpoint store_endpoint(const LaunchOptions& o) {
  if (o.rdzv_endpoint.empty()) return {o.master_addr, o.master_port};
  const std::string& s = o.rdzv_endpoint;
  Endpoint e;
  std::string port;
  if (!s.empty() && s[0] == '[') {  // [v6]:port
    auto close = s.find(']');
    if (close == std::string::npos) throw usage_error("--rdzv_endpoint " + s + " lacks a ']'", kHelpHint);
    e.host = s.substr(1, close - 1);
    if (close + 1 < s.size() && s[close + 1] == ':') port = s.substr(close + 2);
  } else if (auto colon = s.rfind(':'); colon != std::string::npos && s.find(':') == colon) {
    e.host = s.substr(0, colon);
    port = s.substr(colon + 1);
  } else {
    e.host = s;
  }
  if (e.host.empty()) throw usage_error("--rdzv_endpoint " + s + " names no host", "e.g. --rdzv_endpoint node0:29400");
  e.port = port.empty() ? 29400 : to_int("--rdzv_endpoint port", port, 0, 65535);
  return e;
}

void print_launch_help() {
  std::printf(
      "usage: tessera launch [flags] PROGRAM [ARGS...]\n\n"
      "Starts --nproc_per_node copies of PROGRAM on this node, as torchrun does, with RANK,\n"
      "LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, GROUP_RANK, MASTER_ADDR, MASTER_PORT and\n"
      "TESSERA_JOB_TOKEN set; serves or joins the rendezvous store; stops every worker of every\n"
      "node when one fails, and forwards SIGINT/SIGTERM. PROGRAM `tessera` or a bare tessera\n"
      "subcommand (`train`, `preprocess`, ...) runs this tessera; `pretrain_gpt.py` runs\n"
      "`tessera train`; another PROGRAM ending in .py runs with python3.\n\n"
      "flags (also with underscores: --nproc_per_node; --flag=value works):\n");
  for (const auto& f : kFlags) {
    std::string head = std::string("  ") + (f.short_name ? std::string(f.short_name) + ", " : "") + f.name +
                       (f.metavar ? std::string(" ") + f.metavar : "");
    std::string text = std::string(f.help) + (f.default_text ? std::string(" (default: ") + f.default_text + ")" : "");
    std::printf("%s\n", head.c_str());
    // Wrapped at 96 columns, indented by 6.
    std::string line;
    size_t pos = 0;
    while (pos < text.size()) {
      size_t space = text.find(' ', pos);
      std::string word = text.substr(pos, space == std::string::npos ? std::string::npos : space - pos);
      pos = space == std::string::npos ? text.size() : space + 1;
      if (!line.empty() && 6 + line.size() + 1 + word.size() > 96) {
        std::printf("      %s\n", line.c_str());
        line.clear();
      }
      line += (line.empty() ? "" : " ") + word;
    }
    if (!line.empty()) std::printf("      %s\n", line.c_str());
  }
  std::printf(
      "\nexit status: 0 when every worker of every node exited 0; else the failed worker's exit\n"
      "code (128 + signal number when it was killed), 128 + the signal when the launcher was\n"
      "interrupted, 1 for rendezvous errors, 2 for bad flags.\n");
}

}  // namespace tessera::launch
