#include "tessera/comm/nccl/nccl_communicator.h"

#include <nccl.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

#include "tessera/comm/collective_util.h"
#include "tessera/comm/gloo/gloo_communicator.h"
#include "tessera/comm/nccl/nccl_wait.h"
#include "tessera/comm/unique_id.h"
#include "tessera/device/cuda/cuda_check.h"
#include "tessera/device/cuda/cuda_device.h"
#include "tessera/device/cuda/cuda_stream.h"

namespace tessera {
namespace {

using comm_detail::CommPoll;
using Clock = std::chrono::steady_clock;

constexpr const char* kHint = comm_detail::kNcclHint;

[[noreturn]] void nccl_failed(const char* call, ncclResult_t result, const std::string& where) {
  throw runtime_error(std::string(call) + " failed with " + ncclGetErrorString(result) + " on " + where, kHint);
}
#define TESSERA_NCCL(where, fn, ...)                                        \
  do {                                                                      \
    const ncclResult_t tessera_nccl_result_ = fn(__VA_ARGS__);              \
    if (tessera_nccl_result_ != ncclSuccess)                                \
      nccl_failed(#fn, tessera_nccl_result_, (where));                      \
  } while (0)

// Every communicator works in the background (nccl_wait.h): its creation and its calls
// return ncclInProgress until NCCL has finished them.
ncclConfig_t nonblocking_config() {
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  return config;
}

CommPoll poll_comm(ncclComm_t comm) {
  ncclResult_t state = ncclSuccess;
  const ncclResult_t asked = ncclCommGetAsyncError(comm, &state);
  if (asked != ncclSuccess) state = asked;
  if (state == ncclInProgress) return {CommPoll::InProgress, ncclGetLastError(comm)};
  if (state == ncclSuccess) return {CommPoll::Ready, ""};
  return {CommPoll::Failed, std::string(ncclGetErrorString(state)) + ": " + ncclGetLastError(comm)};
}

// Waits until NCCL has finished a call on `comm` that returned `result` (ncclInProgress, or
// an error at once). On failure or at the timeout it runs `abort` and throws; `what` names
// the call: "ncclCommInitRank of 4 ranks on group 'world' (world ranks 0, 1, 2, 3), ...".
void finish(ncclComm_t comm, ncclResult_t result, const std::string& what, std::chrono::milliseconds timeout,
            const std::function<void()>& abort) {
  if (result == ncclSuccess) return;
  if (result != ncclInProgress) {
    const std::string reason = std::string(ncclGetErrorString(result)) + ": " + ncclGetLastError(comm);
    abort();
    throw runtime_error(what + " failed: " + reason, kHint);
  }
  comm_detail::wait_until_ready(what, timeout, [comm] { return poll_comm(comm); }, abort);
}

// One call enqueued on a communication stream, until its completion event fires.
struct InFlight {
  std::string what;  // "all_reduce(sum) of 1024 f32", "send of 4096 bytes to group rank 1 (world rank 3)"
  Clock::time_point start;
  cudaEvent_t done;
};

// What the watchdog sees of one communicator.
struct Watched {
  ncclComm_t comm = nullptr;
  std::string group;  // "group 'dp' (world ranks 0, 2)"
  int ordinal = 0;    // its GPU
  std::mutex lock;
  std::deque<InFlight> calls;
};

// One thread per process, polling every communicator: NCCL's asynchronous errors, and
// the oldest unfinished call against the timeout. Either ends the process (see the header).
class Watchdog {
 public:
  static Watchdog& instance() {
    static auto* dog = new Watchdog();  // leaked: its thread runs until the process ends
    return *dog;
  }
  void add(const std::shared_ptr<Watched>& w, std::chrono::milliseconds timeout) {
    std::lock_guard<std::mutex> guard(lock_);
    if (timeout < timeout_) timeout_ = timeout;
    watched_.push_back(w);
    if (!thread_.joinable()) thread_ = std::thread([this] { loop(); });
  }
  void remove(const std::shared_ptr<Watched>& w) {
    std::lock_guard<std::mutex> guard(lock_);
    std::erase(watched_, w);
  }

 private:
  void loop() {
    for (;;) {
      std::this_thread::sleep_for(std::chrono::seconds(1));
      std::vector<std::shared_ptr<Watched>> now;
      std::chrono::milliseconds timeout;
      {
        std::lock_guard<std::mutex> guard(lock_);
        now = watched_;
        timeout = timeout_;
      }
      for (const auto& w : now) check(*w, timeout);
    }
  }

  static void check(Watched& w, std::chrono::milliseconds timeout) {
    std::lock_guard<std::mutex> guard(w.lock);
    if (!w.comm) return;  // aborted by a failed call, which reported it
    ncclResult_t async = ncclSuccess;
    if (ncclCommGetAsyncError(w.comm, &async) == ncclSuccess && async != ncclSuccess && async != ncclInProgress)
      fail(w, w.calls.empty() ? "a call" : w.calls.front().what,
           std::string(ncclGetErrorString(async)) + ": " + ncclGetLastError(w.comm));
    cudaSetDevice(w.ordinal);
    while (!w.calls.empty()) {
      const cudaError_t state = cudaEventQuery(w.calls.front().done);
      if (state == cudaErrorNotReady) break;
      if (state != cudaSuccess)
        fail(w, w.calls.front().what, std::string("the GPU reported ") + cudaGetErrorName(state) + " (" +
                                          cudaGetErrorString(state) + ")");
      cudaEventDestroy(w.calls.front().done);
      w.calls.pop_front();
    }
    if (!w.calls.empty() && Clock::now() - w.calls.front().start > timeout)
      fail(w, w.calls.front().what,
           "not finished after " + std::to_string(timeout.count() / 1000) +
               " s (--distributed-timeout-minutes): a rank of the group did not reach this call, or the "
               "network stalled");
  }

  [[noreturn]] static void fail(Watched& w, const std::string& what, const std::string& reason) {
    std::fprintf(stderr, "error: NCCL %s on %s: %s\nhint: %s\n", what.c_str(), w.group.c_str(), reason.c_str(),
                 kHint);
    std::fflush(stderr);
    ncclCommAbort(w.comm);
    std::_Exit(1);  // the GPU work cannot be recovered; the launcher stops the other ranks
  }

  std::mutex lock_;
  std::vector<std::shared_ptr<Watched>> watched_;
  std::chrono::milliseconds timeout_ = std::chrono::milliseconds::max();
  std::thread thread_;
};

ncclDataType_t reduce_type(DType d, const std::string& what) {
  switch (d) {
    case DType::F32: return ncclFloat32;
    case DType::I32: return ncclInt32;
    case DType::I64: return ncclInt64;
    default: throw runtime_error(what + ": NCCL reductions take f32, i32 or i64, not " + std::string(dtype_name(d)));
  }
}

void* address(const Tensor& t) { return static_cast<char*>(t.handle) + t.offset; }

// The sends and receives posted since the last flush, launched together in one NCCL group.
struct P2PBatch {
  std::vector<std::function<ncclResult_t(cudaStream_t)>> posts;
  std::string what;
  cudaEvent_t done = nullptr;  // set when launched
  ~P2PBatch() {
    if (done) cudaEventDestroy(done);
  }
};

// NCCL as the device transport of a GroupCommunicator (group_communicator.h): the calls on
// this GPU's tensors, on the communicator's own stream. The group's call numbers, argument
// checks, host tensors and barriers are GroupCommunicator's.
class NcclTransport final : public comm_detail::DeviceTransport {
 public:
  NcclTransport(const comm_detail::Group& group, ncclComm_t comm, Device& gpu, std::chrono::milliseconds timeout)
      : group_(group),
        gpu_(gpu),
        stream_(gpu.create_stream()),
        watched_(std::make_shared<Watched>()),
        timeout_(timeout) {
    watched_->comm = comm;
    watched_->group = group.text();
    watched_->ordinal = gpu.ordinal();
    Watchdog::instance().add(watched_, timeout);
  }
  ~NcclTransport() override {
    if (comm()) flush();
    gpu_.synchronize(stream_);
    Watchdog::instance().remove(watched_);
    for (InFlight& c : watched_->calls) cudaEventDestroy(c.done);
    // A non-blocking communicator finalizes in the background: wait for it (bounded), then
    // free it. A failure has aborted it already and leaves nothing to free.
    try {
      if (comm()) settle(ncclCommFinalize(comm()), "ncclCommFinalize on " + watched_->group);
    } catch (const Error& e) {
      std::fprintf(stderr, "warning: %s\n", e.what());
    }
    if (comm()) ncclCommDestroy(comm());
    gpu_.destroy_stream(stream_);
  }

  const char* backend() const override { return "nccl"; }
  bool addresses(const Tensor& t) const override { return t.device == &gpu_; }

  std::unique_ptr<Work> all_reduce(const Tensor& t, ReduceOp op, const comm_detail::Call& call) override {
    const ncclDataType_t type = reduce_type(t.dtype, call.what);
    return event_work(enqueue(call.what, [&](cudaStream_t s) {
      return ncclAllReduce(address(t), address(t), static_cast<size_t>(t.numel()), type, nccl_op(op), comm(), s);
    }));
  }
  std::unique_ptr<Work> all_gather(const Tensor& out, const Tensor& in, const comm_detail::Call& call) override {
    return event_work(enqueue(call.what, [&](cudaStream_t s) {
      return ncclAllGather(address(in), address(out), in.bytes(), ncclUint8, comm(), s);
    }));
  }
  std::unique_ptr<Work> reduce_scatter(const Tensor& out, const Tensor& in, ReduceOp op,
                                       const comm_detail::Call& call) override {
    const ncclDataType_t type = reduce_type(in.dtype, call.what);
    return event_work(enqueue(call.what, [&](cudaStream_t s) {
      return ncclReduceScatter(address(in), address(out), static_cast<size_t>(out.numel()), type, nccl_op(op),
                               comm(), s);
    }));
  }
  std::unique_ptr<Work> broadcast(const Tensor& t, int root, const comm_detail::Call& call) override {
    return event_work(enqueue(call.what, [&](cudaStream_t s) {
      return ncclBroadcast(address(t), address(t), t.bytes(), ncclUint8, root, comm(), s);
    }));
  }
  std::unique_ptr<Work> post(const Tensor& t, int peer, bool is_send, const comm_detail::P2PText& text) override {
    batch_->what += (batch_->what.empty() ? "" : ", ") + text.what;
    void* data = address(t);
    const size_t bytes = t.bytes();
    ncclComm_t c = comm();
    batch_->posts.push_back([=](cudaStream_t s) {
      return is_send ? ncclSend(data, bytes, ncclUint8, peer, c, s) : ncclRecv(data, bytes, ncclUint8, peer, c, s);
    });
    return std::make_unique<P2PWork>(*this, batch_);
  }

  // Launches the posted sends and receives as one NCCL group.
  void flush() override {
    if (batch_->posts.empty()) return;
    const std::shared_ptr<P2PBatch> batch = std::move(batch_);
    batch_ = std::make_shared<P2PBatch>();
    batch->done = enqueue(batch->what, [&](cudaStream_t s) {
      TESSERA_NCCL(watched_->group, ncclGroupStart);
      for (const auto& post : batch->posts) {
        const ncclResult_t posted = post(s);
        if (posted != ncclSuccess) {
          ncclGroupEnd();
          return posted;
        }
      }
      return ncclGroupEnd();
    });
  }

  // ncclCommSplit, each rank passing its list's index as the colour and its place in the
  // list as the key.
  std::unique_ptr<DeviceTransport> split(const comm_detail::SplitPlan& plan, const comm_detail::Group* sub) override {
    int colour = NCCL_SPLIT_NOCOLOR, key = 0;
    if (plan.mine >= 0) {
      const std::vector<int>& list = plan.groups[static_cast<size_t>(plan.mine)];
      colour = plan.mine;
      key = static_cast<int>(std::find(list.begin(), list.end(), group_.rank) - list.begin());
    }
    tessera::cuda::activate(gpu_);
    ncclComm_t made = nullptr;
    ncclConfig_t config = nonblocking_config();
    const ncclResult_t result = ncclCommSplit(comm(), colour, key, &made, &config);
    const std::string what = "ncclCommSplit into '" + plan.name + "' of " + std::to_string(plan.groups.size()) +
                             " groups of " + std::to_string(plan.groups.empty() ? 0 : plan.groups[0].size()) +
                             " ranks, on " + watched_->group + ", this is world rank " +
                             std::to_string(group_.world_ranks[static_cast<size_t>(group_.rank)]);
    settle(result, what);
    if (made) finish(made, ncclInProgress, what, timeout_, [made] { ncclCommAbort(made); });
    if (!sub) return nullptr;
    return std::make_unique<NcclTransport>(*sub, made, gpu_, timeout_);
  }

  // Work enqueued on the GPU's default stream from now on starts after `done`.
  void join(cudaEvent_t done, bool destroy = true) {
    tessera::cuda::activate(gpu_);
    TESSERA_CUDA_CALL(watched_->group, cudaStreamWaitEvent, tessera::cuda::stream_of(gpu_), done, 0);
    if (destroy) cudaEventDestroy(done);
  }

 private:
  // A call's completion as a Work: wait() orders the default stream after it.
  class EventWork final : public Work {
   public:
    EventWork(NcclTransport& c, cudaEvent_t done) : c_(c), done_(done) {}
    ~EventWork() override {
      if (done_) cudaEventDestroy(done_);
    }
    void wait() override {
      if (!done_) return;
      c_.join(done_);
      done_ = nullptr;
    }

   private:
    NcclTransport& c_;
    cudaEvent_t done_;
  };
  // A posted send or receive: wait() launches its batch if still held, then joins it.
  class P2PWork final : public Work {
   public:
    P2PWork(NcclTransport& c, std::shared_ptr<P2PBatch> batch) : c_(c), batch_(std::move(batch)) {}
    ~P2PWork() override {
      try {
        wait();
      } catch (...) {
      }
    }
    void wait() override {
      if (!batch_) return;
      if (!batch_->done) c_.flush();
      c_.join(batch_->done, false);
      batch_.reset();
    }

   private:
    NcclTransport& c_;
    std::shared_ptr<P2PBatch> batch_;
  };

  std::unique_ptr<Work> event_work(cudaEvent_t done) { return std::make_unique<EventWork>(*this, done); }
  ncclComm_t comm() const { return watched_->comm; }
  // finish() for this communicator: a failure aborts it, and it is not used again, not even
  // by the watchdog.
  void settle(ncclResult_t result, const std::string& what) {
    ncclComm_t c = comm();
    finish(c, result, what, timeout_, [this, c] {
      ncclCommAbort(c);
      std::lock_guard<std::mutex> guard(watched_->lock);
      watched_->comm = nullptr;
    });
  }
  static ncclRedOp_t nccl_op(ReduceOp op) { return op == ReduceOp::Sum ? ncclSum : ncclMax; }

  // Runs `call` on the communication stream after the work issued so far on the default
  // stream; returns its completion event (the caller's) and hands a second one to the
  // watchdog.
  cudaEvent_t enqueue(const std::string& what, const std::function<ncclResult_t(cudaStream_t)>& call) {
    flush();  // held sends and receives go first (a no-op inside flush: the batch is already taken)
    tessera::cuda::activate(gpu_);
    const cudaStream_t comm_stream = tessera::cuda::stream_of(gpu_, stream_);
    cudaEvent_t ready = nullptr, done = nullptr, watched = nullptr;
    const std::string where = what + " on " + watched_->group;
    if (comm() == nullptr)
      throw runtime_error("NCCL " + where + ": the communicator was aborted by an earlier failure", kHint);
    TESSERA_CUDA_CALL(where, cudaEventCreateWithFlags, &ready, cudaEventDisableTiming);
    TESSERA_CUDA_CALL(where, cudaEventRecord, ready, tessera::cuda::stream_of(gpu_));
    TESSERA_CUDA_CALL(where, cudaStreamWaitEvent, comm_stream, ready, 0);
    cudaEventDestroy(ready);  // released once it has fired
    settle(call(comm_stream), "NCCL " + where);
    TESSERA_CUDA_CALL(where, cudaEventCreateWithFlags, &done, cudaEventDisableTiming);
    TESSERA_CUDA_CALL(where, cudaEventCreateWithFlags, &watched, cudaEventDisableTiming);
    TESSERA_CUDA_CALL(where, cudaEventRecord, done, comm_stream);
    TESSERA_CUDA_CALL(where, cudaEventRecord, watched, comm_stream);
    std::lock_guard<std::mutex> guard(watched_->lock);
    watched_->calls.push_back({what, Clock::now(), watched});
    return done;
  }

  comm_detail::Group group_;
  Device& gpu_;
  Stream stream_;
  std::shared_ptr<Watched> watched_;
  std::chrono::milliseconds timeout_;
  std::shared_ptr<P2PBatch> batch_ = std::make_shared<P2PBatch>();
};

}  // namespace

std::unique_ptr<Communicator> create_nccl_communicator(std::shared_ptr<Store> store, int rank, int world_size,
                                                       const CommOptions& options) {
  int ordinal = 0;
  TESSERA_CUDA_CALL("the NCCL communicator (its GPU is the current one: open --device cuda first)", cudaGetDevice,
                    &ordinal);
  Device& gpu = cuda_device(ordinal);
  std::unique_ptr<comm_detail::Transport> host = create_gloo_transport(store, rank, world_size, options);
  const std::vector<uint8_t> id = share_unique_id(
      *store, options.key_prefix + "nccl/world", rank == 0,
      [] {
        ncclUniqueId uid;
        TESSERA_NCCL("world rank 0", ncclGetUniqueId, &uid);
        return std::vector<uint8_t>(reinterpret_cast<uint8_t*>(&uid), reinterpret_cast<uint8_t*>(&uid) + sizeof uid);
      },
      options.timeout);
  ncclUniqueId uid;
  std::memcpy(&uid, id.data(), sizeof uid);
  tessera::cuda::activate(gpu);
  ncclComm_t comm = nullptr;
  ncclConfig_t config = nonblocking_config();
  const ncclResult_t result = ncclCommInitRankConfig(&comm, world_size, uid, rank, &config);
  finish(comm, result,
         "ncclCommInitRank of " + std::to_string(world_size) + " ranks on " + host->group().text() +
             ", this is world rank " + std::to_string(rank) + " (" + gpu.name() + ")",
         options.timeout, [comm] {
           if (comm) ncclCommAbort(comm);
         });
  auto nccl = std::make_unique<NcclTransport>(host->group(), comm, gpu, options.timeout);
  return std::make_unique<comm_detail::GroupCommunicator>(std::move(host), std::move(nccl));
}

}  // namespace tessera

namespace tessera {

std::string nccl_version() {
  int v = 0;
  TESSERA_NCCL("the linked NCCL", ncclGetVersion, &v);
  return std::to_string(v / 10000) + "." + std::to_string(v / 100 % 100) + "." + std::to_string(v % 100);
}

namespace {

// One NCCL rank per GPU of this process, with its stream and buffer; released on any exit.
struct LocalRanks {
  std::vector<ncclComm_t> comms;
  std::vector<cudaStream_t> streams;
  std::vector<float*> data;
  explicit LocalRanks(int n) : comms(n), streams(n), data(n) {}
  ~LocalRanks() {
    for (size_t r = 0; r < comms.size(); ++r) {
      cudaSetDevice(static_cast<int>(r));
      if (data[r]) cudaFree(data[r]);
      if (streams[r]) cudaStreamDestroy(streams[r]);
      if (comms[r]) ncclCommDestroy(comms[r]);
    }
  }
};

// Rank r's input: r + 1 + (i mod 8), small integers, so the f32 sum is exact in any order.
void fill_input(std::vector<float>& host, int r) {
  for (size_t i = 0; i < host.size(); ++i) host[i] = static_cast<float>(r + 1 + static_cast<int>(i % 8));
}

}  // namespace

NcclAllReduceRun nccl_all_reduce_run(size_t bytes) {
  const char* where = "doctor's all-reduce";
  NcclAllReduceRun run;
  TESSERA_CUDA_CALL(where, cudaGetDeviceCount, &run.devices);
  const int n = run.devices;
  const size_t count = bytes / sizeof(float);
  std::vector<float> host(count);
  LocalRanks ranks(n);
  TESSERA_NCCL(where, ncclCommInitAll, ranks.comms.data(), n, nullptr);
  auto load_inputs = [&] {
    for (int r = 0; r < n; ++r) {
      fill_input(host, r);
      TESSERA_CUDA_CALL(where, cudaSetDevice, r);
      TESSERA_CUDA_CALL(where, cudaMemcpy, ranks.data[r], host.data(), bytes, cudaMemcpyHostToDevice);
    }
  };
  auto all_reduce = [&] {
    TESSERA_NCCL(where, ncclGroupStart);
    for (int r = 0; r < n; ++r)
      TESSERA_NCCL(where, ncclAllReduce, ranks.data[r], ranks.data[r], count, ncclFloat32, ncclSum, ranks.comms[r],
                   ranks.streams[r]);
    TESSERA_NCCL(where, ncclGroupEnd);
    for (int r = 0; r < n; ++r) TESSERA_CUDA_CALL(where, cudaStreamSynchronize, ranks.streams[r]);
  };
  for (int r = 0; r < n; ++r) {
    TESSERA_CUDA_CALL(where, cudaSetDevice, r);
    TESSERA_CUDA_CALL(where, cudaStreamCreate, &ranks.streams[r]);
    TESSERA_CUDA_CALL(where, cudaMalloc, reinterpret_cast<void**>(&ranks.data[r]), bytes);
  }
  load_inputs();
  all_reduce();  // warm-up: NCCL connects its channels on the first call
  load_inputs();
  const auto start = Clock::now();
  all_reduce();
  run.ms = std::chrono::duration<double, std::milli>(Clock::now() - start).count();
  run.busbw_gbs = static_cast<double>(bytes) / (run.ms * 1e6) * 2.0 * (n - 1) / n;
  for (int r = 0; r < n; ++r) {
    TESSERA_CUDA_CALL(where, cudaSetDevice, r);
    TESSERA_CUDA_CALL(where, cudaMemcpy, host.data(), ranks.data[r], bytes, cudaMemcpyDeviceToHost);
    for (size_t i = 0; i < count; ++i)
      run.wrong += host[i] != static_cast<float>(n * (n + 1) / 2 + n * static_cast<int>(i % 8));
  }
  return run;
}

const NativeCollectives& nccl_collectives() {
  static const NativeCollectives nccl{
      .name = "nccl",
      .create = create_nccl_communicator,
  };
  return nccl;
}

}  // namespace tessera
