#include "tessera/device/cuda/cuda_device.h"

#include <atomic>
#include <map>
#include <memory>
#include <mutex>

#include "tessera/core/error.h"
#include "tessera/device/cuda/cuda_check.h"
#include "tessera/device/cuda/cuda_stream.h"

namespace tessera {
namespace {

std::string mib(size_t bytes) { return std::to_string(bytes >> 20) + " MiB"; }

class CudaDevice final : public Device {
 public:
  explicit CudaDevice(int ordinal) : ordinal_(ordinal) {
    TESSERA_CUDA_CALL(name(), cudaGetDeviceProperties, &prop_, ordinal_);
    activate();
    TESSERA_CUDA_CALL(name(), cudaStreamCreateWithFlags, &stream_, cudaStreamNonBlocking);
  }

  const char* backend_name() const override { return "cuda"; }
  int ordinal() const override { return ordinal_; }
  std::string name() const override { return "cuda:" + std::to_string(ordinal_); }
  std::string description() const override {
    int driver = 0, runtime = 0;
    cudaDriverGetVersion(&driver);
    cudaRuntimeGetVersion(&runtime);
    return std::string(prop_.name) + " (sm_" + std::to_string(prop_.major) + std::to_string(prop_.minor) + ", " +
           mib(prop_.totalGlobalMem) + ", " + std::to_string(prop_.multiProcessorCount) + " SMs, driver " +
           version(driver) + ", runtime " + version(runtime) + ")";
  }
  bool is_host() const override { return false; }
  MemoryInfo memory_info() const override {
    activate();
    MemoryInfo m;
    TESSERA_CUDA_CALL(where(), cudaMemGetInfo, &m.free_bytes, &m.total_bytes);
    return m;
  }
  void set_tf32_matmul(bool allow) override { tf32_ = allow; }
  bool tf32_matmul() const override { return tf32_; }

  void* allocate(size_t bytes) override {
    refuse_while_capturing("cudaMalloc");
    if (bytes == 0) return nullptr;
    activate();
    void* p = nullptr;
    const cudaError_t err = cudaMalloc(&p, bytes);
    if (err != cudaSuccess) {
      size_t free = 0, total = 0;
      cudaGetLastError();
      cudaMemGetInfo(&free, &total);
      cuda::cuda_call_failed("cudaMalloc", err,
                             where() + " for " + mib(bytes) + " (" + mib(free) + " free of " + mib(total) +
                                 "; tessera holds " + mib(allocated_bytes()) + ")");
    }
    account(static_cast<ptrdiff_t>(bytes));
    return p;
  }
  void free(void* handle, size_t bytes) override {
    refuse_while_capturing("cudaFree");
    if (!handle) return;
    ++frees_;  // a recorded graph may hold this address (replay)
    activate();
    TESSERA_CUDA_CALL(where(), cudaFree, handle);
    account(-static_cast<ptrdiff_t>(bytes));
  }
  void* allocate_pinned(size_t bytes) override {
    refuse_while_capturing("cudaMallocHost");
    if (bytes == 0) return nullptr;
    activate();
    void* p = nullptr;
    TESSERA_CUDA_CALL(where() + " for " + mib(bytes) + " of pinned host memory", cudaMallocHost, &p, bytes);
    return p;
  }
  void free_pinned(void* host, size_t) override {
    if (host) TESSERA_CUDA_CALL(where(), cudaFreeHost, host);
  }

  // The synchronous copies are the async ones on the default stream, then a wait: they
  // follow every op enqueued before them, as the contract says.
  void copy_to_host(void* dst, const void* src, size_t src_offset, size_t bytes) override {
    copy_to_host_async(dst, src, src_offset, bytes, {});
    synchronize({});
  }
  void copy_from_host(void* dst, size_t dst_offset, const void* src, size_t bytes) override {
    copy_from_host_async(dst, dst_offset, src, bytes, {});
    synchronize({});
  }
  void copy_to_host_async(void* dst, const void* src, size_t src_offset, size_t bytes, Stream s) override {
    refuse_while_capturing("a copy to the host");
    if (bytes == 0) return;
    activate();
    TESSERA_CUDA_CALL(where(bytes), cudaMemcpyAsync, dst, static_cast<const char*>(src) + src_offset, bytes,
                      cudaMemcpyDeviceToHost, stream(s));
  }
  void copy_from_host_async(void* dst, size_t dst_offset, const void* src, size_t bytes, Stream s) override {
    refuse_while_capturing("a copy from the host");
    if (bytes == 0) return;
    activate();
    TESSERA_CUDA_CALL(where(bytes), cudaMemcpyAsync, static_cast<char*>(dst) + dst_offset, src, bytes,
                      cudaMemcpyHostToDevice, stream(s));
  }
  void copy(void* dst, size_t dst_offset, const void* src, size_t src_offset, size_t bytes) override {
    if (bytes == 0) return;
    activate();
    char* d = static_cast<char*>(dst) + dst_offset;
    const char* s = static_cast<const char*>(src) + src_offset;
    if (d < s + bytes && s < d + bytes && d != s) {
      // cudaMemcpy's ranges must not overlap; Device::copy allows it, so stage the bytes.
      void* staged = allocate(bytes);
      TESSERA_CUDA_CALL(where(bytes), cudaMemcpyAsync, staged, s, bytes, cudaMemcpyDeviceToDevice, stream_);
      TESSERA_CUDA_CALL(where(bytes), cudaMemcpyAsync, d, staged, bytes, cudaMemcpyDeviceToDevice, stream_);
      synchronize({});
      free(staged, bytes);
      return;
    }
    TESSERA_CUDA_CALL(where(bytes), cudaMemcpyAsync, d, s, bytes, cudaMemcpyDeviceToDevice, stream_);
  }
  void fill_zero(void* dst, size_t dst_offset, size_t bytes) override {
    if (bytes == 0) return;
    activate();
    TESSERA_CUDA_CALL(where(bytes), cudaMemsetAsync, static_cast<char*>(dst) + dst_offset, 0, bytes, stream_);
  }

  Stream create_stream() override {
    activate();
    cudaStream_t s = nullptr;
    TESSERA_CUDA_CALL(where(), cudaStreamCreateWithFlags, &s, cudaStreamNonBlocking);
    return {s};
  }
  void destroy_stream(Stream s) override {
    if (s.handle) TESSERA_CUDA_CALL(where(), cudaStreamDestroy, static_cast<cudaStream_t>(s.handle));
  }
  Event create_event() override {
    activate();
    cudaEvent_t e = nullptr;
    TESSERA_CUDA_CALL(where(), cudaEventCreateWithFlags, &e, cudaEventDisableTiming);
    return {e};
  }
  void destroy_event(Event e) override {
    if (e.handle) TESSERA_CUDA_CALL(where(), cudaEventDestroy, event(e));
  }
  void record_event(Event e, Stream s) override {
    activate();
    TESSERA_CUDA_CALL(where(), cudaEventRecord, event(e), stream(s));
  }
  void wait_event(Stream s, Event e) override {
    activate();
    TESSERA_CUDA_CALL(where(), cudaStreamWaitEvent, stream(s), event(e), 0);
  }
  void synchronize_event(Event e) override { TESSERA_CUDA_CALL(where(), cudaEventSynchronize, event(e)); }
  void synchronize(Stream s) override {
    refuse_while_capturing("cudaStreamSynchronize");
    activate();
    TESSERA_CUDA_CALL(where(), cudaStreamSynchronize, stream(s));
  }

  // CUDA graphs: the default stream's work between begin_capture and end_capture is recorded
  // (cudaStreamBeginCapture, thread-local mode: other threads' calls are not affected),
  // instantiated once and replayed with cudaGraphLaunch.
  Capture capture_support() const override { return Capture::Replay; }
  bool replay(uint64_t id) override {
    const auto it = graphs_.find(id);
    TESSERA_CHECK(it != graphs_.end(), "replay of capture " + std::to_string(id) + " on " + name() + ": none such");
    if (it->second.frees != frees_) return false;
    activate();
    TESSERA_CUDA_CALL(where(), cudaGraphLaunch, it->second.exec, stream_);
    return true;
  }
  void release(uint64_t id) override {
    const auto it = graphs_.find(id);
    if (it == graphs_.end()) return;
    TESSERA_CUDA_CALL(where(), cudaGraphExecDestroy, it->second.exec);
    graphs_.erase(it);
  }

  void activate() const { TESSERA_CUDA_CALL(where(), cudaSetDevice, ordinal_); }
  cudaStream_t stream(Stream s) const { return s.handle ? static_cast<cudaStream_t>(s.handle) : stream_; }

 private:
  static std::string version(int v) { return std::to_string(v / 1000) + "." + std::to_string(v % 1000 / 10); }
  static cudaEvent_t event(Event e) { return static_cast<cudaEvent_t>(e.handle); }
  std::string where(size_t bytes = 0) const {
    std::string w = name() + " (" + prop_.name + ")";
    return bytes ? w + " for " + std::to_string(bytes) + " bytes" : w;
  }

  void start_recording() override {
    activate();
    TESSERA_CUDA_CALL(where(), cudaStreamBeginCapture, stream_, cudaStreamCaptureModeThreadLocal);
  }
  uint64_t stop_recording(bool keep) override {
    activate();
    cudaGraph_t graph = nullptr;
    const cudaError_t ended = cudaStreamEndCapture(stream_, &graph);
    if (!keep || ended != cudaSuccess) {
      if (graph) cudaGraphDestroy(graph);
      cudaGetLastError();  // an error inside the capture invalidated it; the stream is usable again
      if (keep) cuda::cuda_call_failed("cudaStreamEndCapture", ended, where() + " (--enable-cuda-graph)");
      return 0;
    }
    cudaGraphExec_t exec = nullptr;
    const cudaError_t made = cudaGraphInstantiate(&exec, graph, 0);
    cudaGraphDestroy(graph);
    if (made != cudaSuccess) cuda::cuda_call_failed("cudaGraphInstantiate", made, where() + " (--enable-cuda-graph)");
    graphs_[next_graph_] = {exec, frees_};
    return next_graph_++;
  }

  struct Recorded {
    cudaGraphExec_t exec;
    uint64_t frees;  // frees_ when recorded
  };
  int ordinal_;
  cudaDeviceProp prop_{};
  cudaStream_t stream_ = nullptr;
  std::atomic<bool> tf32_{false};
  uint64_t frees_ = 0;
  std::map<uint64_t, Recorded> graphs_;
  uint64_t next_graph_ = 1;
};

const CudaDevice& cuda_of(const Device& device) {
  const auto* cuda = dynamic_cast<const CudaDevice*>(&device);
  TESSERA_CHECK(cuda != nullptr, "CUDA code given a tensor on " + device.name());
  return *cuda;
}

}  // namespace

int cuda_device_count(std::string* why) {
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess) {
    cudaGetLastError();
    if (why) *why = std::string(cudaGetErrorName(err)) + ": " + cudaGetErrorString(err);
    return 0;
  }
  if (count == 0 && why) *why = "the CUDA runtime lists no GPU";
  return count;
}

int cuda_driver_version() {
  int version = 0;
  if (cudaDriverGetVersion(&version) != cudaSuccess) cudaGetLastError();
  return version;
}

int cuda_runtime_version() { return CUDART_VERSION; }

std::vector<std::string> cuda_device_names() {
  std::vector<std::string> names;
  for (int i = 0; i < cuda_device_count(); ++i) {
    cudaDeviceProp p{};
    if (cudaGetDeviceProperties(&p, i) != cudaSuccess) continue;
    names.push_back("cuda:" + std::to_string(i) + " (" + p.name + ", sm_" + std::to_string(p.major) +
                    std::to_string(p.minor) + ", " + std::to_string(p.totalGlobalMem >> 30) + " GiB)");
  }
  return names;
}

Device& cuda_device(int ordinal) {
  static std::mutex lock;
  // Leaked on purpose: the CUDA runtime may be torn down before static destructors run.
  static auto* devices = new std::map<int, std::unique_ptr<CudaDevice>>();
  std::lock_guard<std::mutex> guard(lock);
  auto it = devices->find(ordinal);
  if (it == devices->end()) it = devices->emplace(ordinal, std::make_unique<CudaDevice>(ordinal)).first;
  return *it->second;
}

namespace cuda {

void activate(const Device& device) { cuda_of(device).activate(); }
cudaStream_t stream_of(const Device& device, Stream stream) { return cuda_of(device).stream(stream); }

}  // namespace cuda
}  // namespace tessera
