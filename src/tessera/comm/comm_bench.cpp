#include "tessera/comm/comm_bench.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "tessera/comm/gloo/gloo_communicator.h"
#include "tessera/comm/gloo/raw_gloo.h"
#include "tessera/comm/local_ranks.h"
#include "tessera/comm/store.h"
#include "tessera/core/error.h"
#include "tessera/core/log.h"
#include "tessera/device/cpu/cpu_device.h"
#include "tessera/device/registry.h"

namespace tessera {

namespace {

using Clock = std::chrono::steady_clock;

enum class Coll { AllReduce, AllGather, ReduceScatter, Broadcast };

struct BenchOptions {
  int64_t min_bytes = 32 << 20;
  int64_t max_bytes = 32 << 20;
  double step_factor = 2;
  int iters = 20;
  int warmup = 5;
  int rounds = 3;
  bool check = true;
  DType dtype = DType::F32;
  ReduceOp op = ReduceOp::Sum;
  Coll coll = Coll::AllReduce;
  bool raw = true;
  int spawn = 0;
  double timeout_minutes = 5;
  std::string device;  // empty: host memory; else the buffers live there (the host-staged path)
};

const char* kUsage =
    "usage: tessera bench comm [-b MINBYTES] [-e MAXBYTES] [-f STEPFACTOR] [-n ITERS] [-w WARMUP] [-R ROUNDS]\n"
    "                          [-c 0|1] [-d float|int32|int64] [-o sum|max]\n"
    "                          [-C all_reduce|all_gather|reduce_scatter|broadcast] [--raw 0|1]\n"
    "                          [--spawn N] [--timeout-minutes M] [--device SPEC]\n"
    "\n"
    "An nccl-tests-style sweep of one collective through tessera's Communicator (Gloo), next to\n"
    "the same call on a raw Gloo context. Run it as N processes: --spawn N forks them here, or\n"
    "start it under `tessera launch` / torchrun. Sizes take K, M, G (powers of 1024).\n"
    "Each size runs ROUNDS rounds of ITERS calls, alternating tessera and raw Gloo, and reports\n"
    "the best round of each (shared machines are noisy). --device strict|opencl[:N] keeps tessera's\n"
    "buffers on that device, so its columns time the host-staged path against raw Gloo on host memory.\n"
    "Defaults: -b 32M -e 32M -f 2 -n 20 -w 5 -R 3 -c 1 -d float -o sum -C all_reduce --raw 1.\n";

int64_t parse_size(const std::string& flag, const std::string& v) {
  char* end = nullptr;
  double x = std::strtod(v.c_str(), &end);
  std::string suffix = end ? end : "";
  double mult = 1;
  if (suffix == "K" || suffix == "k") mult = 1024.0;
  else if (suffix == "M" || suffix == "m") mult = 1024.0 * 1024;
  else if (suffix == "G" || suffix == "g") mult = 1024.0 * 1024 * 1024;
  else if (!suffix.empty() || end == v.c_str())
    throw usage_error(flag + " takes a size such as 64, 8K, 32M or 1G, got '" + v + "'");
  if (x < 0) throw usage_error(flag + " must not be negative, got '" + v + "'");
  return static_cast<int64_t>(x * mult);
}

int parse_int(const std::string& flag, const std::string& v, int min) {
  char* end = nullptr;
  long x = std::strtol(v.c_str(), &end, 10);
  if (end == v.c_str() || *end != '\0' || x < min)
    throw usage_error(flag + " takes an integer >= " + std::to_string(min) + ", got '" + v + "'");
  return static_cast<int>(x);
}

BenchOptions parse(int argc, char** argv, bool* help) {
  BenchOptions o;
  *help = false;
  for (int i = 0; i < argc; ++i) {
    std::string a = argv[i];
    std::string value;
    if (auto eq = a.find('='); a.rfind("--", 0) == 0 && eq != std::string::npos) {
      value = a.substr(eq + 1);
      a = a.substr(0, eq);
    } else if (a == "-h" || a == "--help") {
      *help = true;
      return o;
    } else {
      if (i + 1 >= argc) throw usage_error(a + " needs a value", "see `tessera bench comm --help`");
      value = argv[++i];
    }
    if (a == "-b" || a == "--minbytes") o.min_bytes = parse_size(a, value);
    else if (a == "-e" || a == "--maxbytes") o.max_bytes = parse_size(a, value);
    else if (a == "-f" || a == "--stepfactor") {
      o.step_factor = std::strtod(value.c_str(), nullptr);
      if (!(o.step_factor > 1)) throw usage_error(a + " must be greater than 1, got '" + value + "'");
    } else if (a == "-n" || a == "--iters") o.iters = parse_int(a, value, 1);
    else if (a == "-w" || a == "--warmup_iters") o.warmup = parse_int(a, value, 0);
    else if (a == "-R" || a == "--rounds") o.rounds = parse_int(a, value, 1);
    else if (a == "-c" || a == "--check") o.check = parse_int(a, value, 0) != 0;
    else if (a == "--raw") o.raw = parse_int(a, value, 0) != 0;
    else if (a == "--spawn") o.spawn = parse_int(a, value, 1);
    else if (a == "--device") o.device = value;
    else if (a == "--timeout-minutes") {
      o.timeout_minutes = std::strtod(value.c_str(), nullptr);
      if (!(o.timeout_minutes > 0)) throw usage_error(a + " must be positive, got '" + value + "'");
    } else if (a == "-d" || a == "--datatype") {
      if (value == "float" || value == "f32") o.dtype = DType::F32;
      else if (value == "int32" || value == "i32" || value == "int") o.dtype = DType::I32;
      else if (value == "int64" || value == "i64") o.dtype = DType::I64;
      else throw usage_error(a + " takes float, int32 or int64, got '" + value + "'");
    } else if (a == "-o" || a == "--op") {
      if (value == "sum") o.op = ReduceOp::Sum;
      else if (value == "max") o.op = ReduceOp::Max;
      else throw usage_error(a + " takes sum or max, got '" + value + "'");
    } else if (a == "-C" || a == "--coll") {
      if (value == "all_reduce" || value == "allreduce") o.coll = Coll::AllReduce;
      else if (value == "all_gather" || value == "allgather") o.coll = Coll::AllGather;
      else if (value == "reduce_scatter" || value == "reducescatter") o.coll = Coll::ReduceScatter;
      else if (value == "broadcast") o.coll = Coll::Broadcast;
      else throw usage_error(a + " takes all_reduce, all_gather, reduce_scatter or broadcast, got '" + value + "'");
    } else {
      throw usage_error("unknown flag '" + a + "' for tessera bench comm", "see `tessera bench comm --help`");
    }
  }
  if (o.min_bytes > o.max_bytes)
    throw usage_error("-b (" + std::to_string(o.min_bytes) + ") is larger than -e (" + std::to_string(o.max_bytes) +
                      ")");
  return o;
}

const char* coll_name(Coll c) {
  switch (c) {
    case Coll::AllReduce: return "all_reduce";
    case Coll::AllGather: return "all_gather";
    case Coll::ReduceScatter: return "reduce_scatter";
    case Coll::Broadcast: return "broadcast";
  }
  return "?";
}

double bus_factor(Coll c, int n) {
  switch (c) {
    case Coll::AllReduce: return 2.0 * (n - 1) / n;
    case Coll::AllGather:
    case Coll::ReduceScatter: return static_cast<double>(n - 1) / n;
    case Coll::Broadcast: return 1.0;
  }
  return 1.0;
}

const char* dtype_label(DType t) { return t == DType::F32 ? "float" : t == DType::I32 ? "int32" : "int64"; }

// Where this process is in the job, from the launcher's variables.
struct BenchWorld {
  int rank = 0;
  int world_size = 1;
  std::string master_addr;
  int master_port = 0;
  std::string store_host;
  int store_port = 0;
  bool serve_store = false;
  std::string token;
};

int env_int(const char* name, int fallback) {
  const char* v = std::getenv(name);
  return v && *v ? std::atoi(v) : fallback;
}
std::string env_str(const char* name) {
  const char* v = std::getenv(name);
  return v ? v : "";
}

// torchrun's contract as launch/worker_env.h describes it: under `tessera launch`
// (TESSERA_LAUNCHER set) the launcher serves the store on MASTER_ADDR:MASTER_PORT; under
// torchrun, rank 0 serves it on TESSERA_STORE_PORT or MASTER_PORT + 1.
BenchWorld bench_world_from_env() {
  BenchWorld w;
  if (env_str("RANK").empty() && env_str("WORLD_SIZE").empty()) return w;
  w.rank = env_int("RANK", -1);
  w.world_size = env_int("WORLD_SIZE", -1);
  if (w.rank < 0 || w.world_size < 1 || w.rank >= w.world_size)
    throw usage_error("RANK=" + env_str("RANK") + " and WORLD_SIZE=" + env_str("WORLD_SIZE") + " do not describe a rank",
                      "run under `tessera launch` or torchrun, or use --spawn N");
  w.master_addr = env_str("MASTER_ADDR");
  w.master_port = env_int("MASTER_PORT", 0);
  if (w.world_size > 1 && (w.master_addr.empty() || w.master_port <= 0))
    throw usage_error("MASTER_ADDR and MASTER_PORT must be set for " + std::to_string(w.world_size) + " ranks",
                      "run under `tessera launch` or torchrun, or use --spawn N");
  w.store_host = w.master_addr;
  if (!env_str("TESSERA_LAUNCHER").empty()) {
    w.store_port = w.master_port;
  } else {
    w.store_port = env_int("TESSERA_STORE_PORT", w.master_port + 1);
    w.serve_store = w.rank == 0;
  }
  w.token = default_job_token();
  return w;
}

// A host tensor and, with a device spec, its copy on that device (t: what tessera's calls get).
struct Twin {
  Twin(const Tensor& host, const std::string& spec) : host(host), t(host) {
    if (spec.empty()) return;
    Device& device = open_device(spec);
    buffer = Buffer(device, host.bytes());
    t = Tensor(buffer.handle(), 0, host.dtype, host.shape, &device);
  }
  void upload() {
    if (buffer.bytes()) copy_from_host(t, cpu_memory(host), host.bytes());
  }
  void download() {
    if (buffer.bytes()) copy_to_host(cpu_memory(host), host.bytes(), t);
  }
  Tensor host;
  Buffer buffer;
  Tensor t;
};

struct AlignedBuffer {
  explicit AlignedBuffer(size_t bytes) : bytes(bytes) {
    ptr = bytes ? std::aligned_alloc(64, (bytes + 63) / 64 * 64) : nullptr;
    if (bytes && !ptr) throw runtime_error("cannot allocate " + std::to_string(bytes) + " bytes for the benchmark");
    if (ptr) std::memset(ptr, 0, bytes);
  }
  ~AlignedBuffer() { std::free(ptr); }
  AlignedBuffer(const AlignedBuffer&) = delete;
  AlignedBuffer& operator=(const AlignedBuffer&) = delete;
  void* ptr = nullptr;
  size_t bytes;
};

// Exact-sum pattern: element i of rank r is (r + 1) * (i % 7 + 1), or for data-moving
// collectives a value that names the rank and the position.
double pattern(int rank, int64_t i) { return static_cast<double>(rank + 1) * static_cast<double>(i % 7 + 1); }
double move_pattern(int rank, int64_t i) { return static_cast<double>(rank * 1000 + i % 1000); }

template <typename T>
void fill_typed(T* p, int64_t n, int rank, bool move) {
  for (int64_t i = 0; i < n; ++i) p[i] = static_cast<T>(move ? move_pattern(rank, i) : pattern(rank, i));
}
void fill(DType t, void* p, int64_t n, int rank, bool move) {
  if (t == DType::F32) fill_typed(static_cast<float*>(p), n, rank, move);
  else if (t == DType::I32) fill_typed(static_cast<int32_t*>(p), n, rank, move);
  else fill_typed(static_cast<int64_t*>(p), n, rank, move);
}
double value_at(DType t, const void* p, int64_t i) {
  if (t == DType::F32) return static_cast<const float*>(p)[i];
  if (t == DType::I32) return static_cast<const int32_t*>(p)[i];
  return static_cast<double>(static_cast<const int64_t*>(p)[i]);
}

// The expected reduction over n ranks of pattern(r, i).
double reduced(ReduceOp op, int n, int64_t i) {
  return op == ReduceOp::Sum ? (i % 7 + 1) * (n * (n + 1) / 2.0) : static_cast<double>(n) * (i % 7 + 1);
}

class Bench {
 public:
  Bench(const BenchOptions& o, const BenchWorld& w) : o_(o), w_(w) {}

  int run() {
    const auto timeout = std::chrono::milliseconds(static_cast<int64_t>(o_.timeout_minutes * 60000));
    std::unique_ptr<TcpStoreServer> server;
    if (w_.serve_store) server = std::make_unique<TcpStoreServer>(w_.store_port, w_.token);
    std::shared_ptr<Store> store = w_.world_size > 1
                                       ? std::shared_ptr<Store>(connect_tcp_store(w_.store_host, w_.store_port,
                                                                                  w_.token, timeout))
                                       : std::shared_ptr<Store>(make_local_store(timeout));
    set_log_rank(w_.rank, w_.world_size);
    GlooOptions gopt;
    gopt.timeout = timeout;
    gopt.master_addr = w_.master_addr;
    gopt.master_port = w_.master_port;
    gopt.key_prefix = "bench/";
    comm_ = create_gloo_communicator(store, w_.rank, w_.world_size, gopt);
    const bool raw = o_.raw && w_.world_size > 1 && o_.coll != Coll::ReduceScatter;
    if (w_.world_size > 1) iface_ = gloo_interface(gopt);
    if (raw) raw_ = std::make_unique<RawGlooGroup>(*store, "bench/raw", w_.rank, w_.world_size, gopt);
    header(raw);

    const int n = w_.world_size;
    const size_t esize = dtype_size(o_.dtype);
    double bus_sum = 0, ratio_sum_big = 0;
    int rows = 0, rows_big = 0;
    int64_t wrong_total = 0;
    for (double b = static_cast<double>(o_.min_bytes); b <= static_cast<double>(o_.max_bytes) * 1.0000001;
         b *= o_.step_factor) {
      int64_t count = static_cast<int64_t>(b) / static_cast<int64_t>(esize);
      if (o_.coll == Coll::AllGather || o_.coll == Coll::ReduceScatter) count = count / n * n;
      if (count <= 0) continue;
      const int64_t bytes = count * static_cast<int64_t>(esize);
      Row row = measure(count, raw);
      const double alg = row.us > 0 ? bytes / row.us / 1e3 : 0;  // GB/s
      const double bus = alg * bus_factor(o_.coll, n);
      bus_sum += bus;
      ++rows;
      wrong_total += row.wrong;
      if (w_.rank == 0) {
        std::printf("%12lld  %12lld  %6s  %5s  %10.1f  %7.2f  %7.2f  %7s", static_cast<long long>(bytes),
                    static_cast<long long>(count), dtype_label(o_.dtype), redop_label(),
                    row.us, alg, bus, o_.check ? std::to_string(row.wrong).c_str() : "N/A");
        if (raw) {
          const double raw_alg = row.raw_us > 0 ? bytes / row.raw_us / 1e3 : 0;
          const double raw_bus = raw_alg * bus_factor(o_.coll, n);
          const double ratio = raw_bus > 0 ? bus / raw_bus : 0;
          std::printf("  %10.1f  %7.2f  %7.2f  %6.3f", row.raw_us, raw_alg, raw_bus, ratio);
          if (bytes >= (16 << 20)) {
            ratio_sum_big += ratio;
            ++rows_big;
          }
        }
        std::printf("\n");
        std::fflush(stdout);
      }
    }
    if (w_.rank == 0) {
      std::printf("# Out of bounds values : %lld %s\n", static_cast<long long>(wrong_total),
                  wrong_total == 0 ? "OK" : "FAILED");
      std::printf("# Avg bus bandwidth    : %g GB/s\n", rows ? bus_sum / rows : 0.0);
      if (rows_big)
        std::printf("# Sizes >= 16 MB       : tessera busbw / raw Gloo busbw = %.3f on average (bar: 0.95)\n",
                    ratio_sum_big / rows_big);
      std::fflush(stdout);
    }
    comm_->barrier();  // nobody leaves while the store (maybe served here) is in use
    comm_.reset();
    raw_.reset();
    return wrong_total == 0 ? 0 : 1;
  }

 private:
  const char* redop_label() const {
    if (o_.coll == Coll::AllGather || o_.coll == Coll::Broadcast) return "none";
    return o_.op == ReduceOp::Sum ? "sum" : "max";
  }

  struct Row {
    double us = 0;
    double raw_us = 0;
    int64_t wrong = 0;
  };

  void header(bool raw) {
    if (w_.rank != 0) return;
    std::printf("# tessera bench comm: %s, %d rank(s), gloo", coll_name(o_.coll), w_.world_size);
    if (w_.world_size > 1) std::printf(" over %s (%s)", iface_.name.c_str(), iface_.ipv4.c_str());
    std::printf(", %s, %d iterations after %d warm-up, check %s, tessera's buffers on %s\n", dtype_label(o_.dtype),
                o_.iters, o_.warmup, o_.check ? "on" : "off", o_.device.empty() ? "the host" : o_.device.c_str());
    std::printf("# time: mean per call on the slowest rank, best of %d alternating rounds; busbw factor %s\n",
                o_.rounds,
                o_.coll == Coll::AllReduce ? "2(n-1)/n" : o_.coll == Coll::Broadcast ? "1" : "(n-1)/n");
    std::printf("#%77s", "tessera Communicator");
    if (raw) std::printf("  %34s", "raw Gloo");
    std::printf("\n#%11s  %12s  %6s  %5s  %10s  %7s  %7s  %7s", "size", "count", "type", "redop", "time", "algbw",
                "busbw", "#wrong");
    if (raw) std::printf("  %10s  %7s  %7s  %6s", "time", "algbw", "busbw", "ratio");
    std::printf("\n#%11s  %12s  %6s  %5s  %10s  %7s  %7s  %7s", "(B)", "(elements)", "", "", "(us)", "(GB/s)",
                "(GB/s)", "");
    if (raw) std::printf("  %10s  %7s  %7s  %6s", "(us)", "(GB/s)", "(GB/s)", "");
    std::printf("\n");
    std::fflush(stdout);
  }

  // One collective through tessera's Communicator.
  void ours(const Tensor& a, const Tensor& b) {
    switch (o_.coll) {
      case Coll::AllReduce: comm_->all_reduce(a, o_.op); break;
      case Coll::AllGather: comm_->all_gather(b, a); break;
      case Coll::ReduceScatter: comm_->reduce_scatter(b, a, o_.op); break;
      case Coll::Broadcast: comm_->broadcast(a, 0); break;
    }
  }

  // The same collective as a raw Gloo call.
  void raw_call(const Tensor& a, const Tensor& b) {
    switch (o_.coll) {
      case Coll::AllReduce: raw_->all_reduce(a, o_.op); break;
      case Coll::AllGather: raw_->all_gather(b, a); break;
      case Coll::Broadcast: raw_->broadcast(a, 0); break;
      case Coll::ReduceScatter: break;
    }
  }

  // Mean microseconds per call on the slowest rank.
  template <typename F>
  double time_calls(F call) {
    for (int i = 0; i < o_.warmup; ++i) call();
    comm_->barrier();
    const auto t0 = Clock::now();
    for (int i = 0; i < o_.iters; ++i) call();
    const auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - t0).count();
    int64_t slowest = ns;
    comm_->all_reduce(Tensor(&slowest, DType::I64, {1}, nullptr), ReduceOp::Max);
    return static_cast<double>(slowest) / 1e3 / o_.iters;
  }

  Row measure(int64_t count, bool raw) {
    const int n = w_.world_size;
    const size_t esize = dtype_size(o_.dtype);
    // a: the input (in place for all_reduce and broadcast); b: the output of all_gather
    // (n x a) and reduce_scatter (a / n).
    int64_t a_count = count, b_count = 0;
    if (o_.coll == Coll::AllGather) a_count = count / n, b_count = count;
    if (o_.coll == Coll::ReduceScatter) b_count = count / n;
    AlignedBuffer a_buf(a_count * esize), b_buf(b_count * esize);
    Tensor a(a_buf.ptr, o_.dtype, {a_count}, nullptr);
    Tensor b(b_buf.ptr, o_.dtype, {b_count}, nullptr);
    // With --device, tessera's calls run on copies of a and b on that device; raw Gloo keeps
    // the host buffers.
    Twin ta(a, o_.device), tb(b, o_.device);
    // Timing runs on a buffer of ones (repeated sums stay finite for a long time and never
    // become subnormal).
    fill(o_.dtype, cpu_memory(a), a_count, 0, false);
    ta.upload();
    Row row;
    for (int round = 0; round < o_.rounds; ++round) {
      const double us = time_calls([&] { ours(ta.t, tb.t); });
      row.us = round == 0 ? us : std::min(row.us, us);
      if (raw) {
        fill(o_.dtype, cpu_memory(a), a_count, 0, false);
        const double raw_us = time_calls([&] { raw_call(a, b); });
        row.raw_us = round == 0 ? raw_us : std::min(row.raw_us, raw_us);
      }
    }
    if (o_.check) {
      const bool move = o_.coll == Coll::AllGather || o_.coll == Coll::Broadcast;
      fill(o_.dtype, cpu_memory(a), a_count, w_.rank, move);
      ta.upload();
      ours(ta.t, tb.t);
      ta.download();
      tb.download();
      int64_t wrong = 0;
      switch (o_.coll) {
        case Coll::AllReduce:
          for (int64_t i = 0; i < a_count; ++i) wrong += value_at(o_.dtype, cpu_memory(a), i) != reduced(o_.op, n, i);
          break;
        case Coll::AllGather:
          for (int64_t i = 0; i < b_count; ++i)
            wrong += value_at(o_.dtype, cpu_memory(b), i) != move_pattern(static_cast<int>(i / a_count), i % a_count);
          break;
        case Coll::ReduceScatter:
          for (int64_t i = 0; i < b_count; ++i)
            wrong += value_at(o_.dtype, cpu_memory(b), i) != reduced(o_.op, n, w_.rank * b_count + i);
          break;
        case Coll::Broadcast:
          for (int64_t i = 0; i < a_count; ++i) wrong += value_at(o_.dtype, cpu_memory(a), i) != move_pattern(0, i);
          break;
      }
      comm_->all_reduce(Tensor(&wrong, DType::I64, {1}, nullptr), ReduceOp::Sum);
      row.wrong = wrong;
    }
    return row;
  }

  BenchOptions o_;
  BenchWorld w_;
  InterfaceChoice iface_;
  std::unique_ptr<Communicator> comm_;
  std::unique_ptr<RawGlooGroup> raw_;
};

}  // namespace

int run_comm_bench(int argc, char** argv) {
  bool help = false;
  BenchOptions o = parse(argc, argv, &help);
  if (help) {
    std::printf("%s", kUsage);
    return 0;
  }
  if (o.spawn > 0) {
    LocalRanksOptions lo;
    lo.world_size = o.spawn;
    lo.capture_output = false;
    lo.timeout = std::chrono::milliseconds(static_cast<int64_t>(o.timeout_minutes * 60000)) * 2;
    auto results = run_local_ranks(lo, [&](int) { return Bench(o, bench_world_from_env()).run(); });
    int status = 0;
    for (const auto& r : results) {
      if (r.exit_code == 0 && !r.timed_out) continue;
      std::fprintf(stderr, "error: rank %d %s\n", r.rank,
                   r.timed_out        ? "was killed after the timeout"
                   : r.term_signal    ? ("was killed by signal " + std::to_string(r.term_signal)).c_str()
                                      : ("exited with status " + std::to_string(r.exit_code)).c_str());
      status = 1;
    }
    return status;
  }
  return Bench(o, bench_world_from_env()).run();
}

}  // namespace tessera
