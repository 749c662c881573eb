// The Device interface: what model, optimizer, parallel and checkpoint code may ask of an
// accelerator, shaped after ggml-backend (ggml/src/ggml-backend-impl.h: registry -> device
// -> buffer/stream). Each device belongs to a backend (backend.h), which holds its kernel
// table (ops/) and its collectives (comm/).
//
// Decisions every backend follows:
// - Memory is an opaque handle plus a byte offset. allocate() returns the handle: a host
//   address on the CPU, a device pointer on CUDA, a cl_mem on OpenCL. Code outside a
//   backend never does arithmetic on a handle; it moves the offset (Tensor does this).
// - is_host() says whether code outside the backend may read the memory by address. Only
//   the CPU device says yes; the strict test device keeps host memory but says no, so a
//   stray host access fails a test. Tensor's host accessors check it.
// - Every device has a default stream on which ops and copies run in issue order. The
//   synchronous copies return when the data has arrived; the *_async copies return at
//   once and the host buffer must stay untouched until the stream is synchronized (use
//   pinned buffers for them). Streams and events are opaque; on the CPU they are inline
//   no-ops (every call completes before it returns).
// - Errors are tessera::Error naming the call, the device and the sizes involved.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <string>

#include "tessera/core/tensor.h"
#include "tessera/device/buffer.h"

namespace tessera {

struct Backend;

struct MemoryInfo {
  size_t total_bytes = 0;
  size_t free_bytes = 0;
};

// Opaque per-backend objects; a null handle is the default stream / an unused event.
struct Stream {
  void* handle = nullptr;
};
struct Event {
  void* handle = nullptr;
};

class Device {
 public:
  virtual ~Device() = default;

  // Identity. The backend it belongs to, by its registered name ("cpu", "strict", "cuda").
  virtual const char* backend_name() const = 0;
  const Backend& backend() const;
  virtual int ordinal() const { return 0; }
  // Short name as --device spells it: "cpu", "strict", "opencl:1".
  virtual std::string name() const = 0;
  // What the hardware and driver say about themselves (for the log and doctor).
  virtual std::string description() const { return name(); }
  virtual bool is_host() const = 0;
  virtual MemoryInfo memory_info() const = 0;
  // --tf32: f32 GEMMs may round their operands to TF32 (10-bit mantissa) on tensor cores,
  // as PyTorch's torch.backends.cuda.matmul.allow_tf32 = True. Off by default: exact f32.
  // Only CUDA has such a mode; the other backends ignore it and stay exact.
  virtual void set_tf32_matmul(bool allow) { (void)allow; }
  virtual bool tf32_matmul() const { return false; }
  // --deterministic-mode (Megatron's flag): every op keeps the fixed-order, unfused path, so
  // a run gives the same bits in every parallel layout and on every run (ops/precision.h).
  // Off by default: ops may take their fused kernels and their own summation order, each
  // within its precision class's bound; a run is still repeatable on one backend and layout.
  void set_deterministic_mode(bool on) { deterministic_mode_ = on; }
  bool deterministic_mode() const { return deterministic_mode_; }

  // Device memory. allocate(0) returns nullptr. Throws tessera::Error naming the size and
  // what is in use when the allocation fails. A backend's memory starts at least 64-byte
  // aligned on the device (SlabBuilder's offsets keep that alignment for every tensor in a
  // slab; cudaMalloc gives 256, an OpenCL buffer is its own object at offset 0).
  virtual void* allocate(size_t bytes) = 0;
  virtual void free(void* handle, size_t bytes) = 0;
  // Host memory the device copies to and from fastest (page-locked where the backend can);
  // what the *_async copies want.
  virtual void* allocate_pinned(size_t bytes);
  virtual void free_pinned(void* host, size_t bytes);

  // Synchronous copies between host memory and (handle, offset).
  virtual void copy_to_host(void* dst, const void* src, size_t src_offset, size_t bytes) = 0;
  virtual void copy_from_host(void* dst, size_t dst_offset, const void* src, size_t bytes) = 0;
  // Device to device on this device; the ranges may overlap.
  virtual void copy(void* dst, size_t dst_offset, const void* src, size_t src_offset, size_t bytes) = 0;
  virtual void fill_zero(void* dst, size_t dst_offset, size_t bytes) = 0;
  // Stream-ordered copies; the defaults are the synchronous ones (complete on return).
  virtual void copy_to_host_async(void* dst, const void* src, size_t src_offset, size_t bytes, Stream stream);
  virtual void copy_from_host_async(void* dst, size_t dst_offset, const void* src, size_t bytes, Stream stream);

  // Ordering. The defaults are the CPU's inline no-ops.
  virtual Stream create_stream() { return {}; }
  virtual void destroy_stream(Stream) {}
  virtual Event create_event() { return {}; }
  virtual void destroy_event(Event) {}
  // Marks the point in `stream` that wait_event / synchronize_event wait for.
  virtual void record_event(Event, Stream) {}
  // Work enqueued on `stream` after this call starts after the event's point.
  virtual void wait_event(Stream, Event) {}
  virtual void synchronize_event(Event) {}
  // Blocks the host until everything enqueued on `stream` has finished.
  virtual void synchronize(Stream stream = {}) = 0;

  // Bytes currently allocated through this device, and the high-water mark. Safe to call
  // from the threads of in-process ranks that share the device.
  size_t allocated_bytes() const { return allocated_.load(std::memory_order_relaxed); }
  size_t peak_allocated_bytes() const { return peak_.load(std::memory_order_relaxed); }
  // Whole-tensor copies to the host (the free copy_to_host below) since construction: each
  // one waits for the device, so the training step counts them (at most one per step).
  uint64_t host_reads() const { return host_reads_.load(std::memory_order_relaxed); }
  void count_host_read() { host_reads_.fetch_add(1, std::memory_order_relaxed); }

  // Capture of a region of work for replay (CUDA graphs, --enable-cuda-graph). Between
  // begin_capture() and end_capture() the work issued on the default stream is recorded;
  // what a replay could not repeat (an allocation or a free, a synchronous copy to or from
  // the host, a synchronisation) throws an Error naming the call. end_capture(false) drops
  // the recording (after an error). capture_support() says what the device does:
  //   None: no capture (begin_capture throws);
  //   Replay: the work is recorded, not run (CUDA: cudaStreamBeginCapture); end_capture
  //     returns the recording's id (> 0), replay(id) enqueues it again, release(id) frees it;
  //   CheckOnly: the work runs as it is issued and the refusals hold, nothing is recorded
  //     (the strict test device: CPU tests prove a region capturable); end_capture returns 0.
  enum class Capture { None, Replay, CheckOnly };
  virtual Capture capture_support() const { return Capture::None; }
  void begin_capture();
  uint64_t end_capture(bool keep = true);
  bool capturing() const { return capturing_; }
  // Enqueues recording `id` on the default stream; false (nothing enqueued) when this device
  // has freed memory since the recording, whose addresses may then be stale: capture again.
  virtual bool replay(uint64_t id);
  virtual void release(uint64_t id) { (void)id; }

 protected:
  void account(ptrdiff_t delta);
  // What capture_support() == Replay backends record with (begin/end_capture call them).
  virtual void start_recording() {}
  virtual uint64_t stop_recording(bool keep) {
    (void)keep;
    return 0;
  }
  // Backends call this first in allocate, free, the synchronous copies and synchronize.
  void refuse_while_capturing(const char* call) const;

 private:
  std::atomic<size_t> allocated_{0};
  std::atomic<size_t> peak_{0};
  mutable std::atomic<const Backend*> backend_{nullptr};  // looked up by name on first use
  std::atomic<uint64_t> host_reads_{0};
  bool deterministic_mode_ = false;
  bool capturing_ = false;
};

// Whole-tensor transfers, through the tensor's device.
// Copies src to host memory of dst_capacity bytes (the capacity is checked, as CANN's
// destMax is).
void copy_to_host(void* dst, size_t dst_capacity, Tensor src);
// Copies src_bytes (== dst.bytes()) of host memory into dst.
void copy_from_host(Tensor dst, const void* src, size_t src_bytes);
// Host f32 values into a floating tensor (F32, BF16 or F16), rounded to its dtype
// (round-to-nearest-even, core/dtype.h) on the host; count == dst.numel(). For loads and
// imports, not for the step loop.
void copy_floats_from_host(Tensor dst, const float* src, size_t count);
// A floating tensor's values, widened to f32 (exact) on the host; count == src.numel().
void copy_floats_to_host(float* dst, size_t count, Tensor src);
// dst = src; same device, same byte size.
void copy_tensor(Tensor dst, Tensor src);
void fill_zero(Tensor t);

// The process-wide CPU device (the host; present in every build).
Device& cpu_device();

}  // namespace tessera
