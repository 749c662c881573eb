// What every backend shares: the memory accounting, pinned-buffer and async-copy defaults,
// and the whole-tensor transfers.
#include "tessera/device/device.h"

#include <cstdlib>
#include <string>
#include <vector>

#include "tessera/device/backend.h"

namespace tessera {

void* Tensor::host_address(Where where) const {
  if (handle == nullptr) return nullptr;
  if (device != nullptr && !device->is_host())
    check_failed("device->is_host()", where.file_name(), static_cast<int>(where.line()),
                 "host access to a " + shape_str(shape) + " tensor on device " +
                     (device ? device->name() : std::string("(none)")) +
                     ", which is not host memory: copy it with copy_to_host / copy_from_host (device/device.h) "
                     "or do the work in an op");
  return static_cast<char*>(handle) + offset;
}

const Backend& Device::backend() const {
  const Backend* b = backend_.load(std::memory_order_acquire);
  if (b == nullptr) {
    b = find_backend(backend_name());
    TESSERA_CHECK(b != nullptr, std::string("device ") + name() + " of unregistered backend " + backend_name());
    backend_.store(b, std::memory_order_release);
  }
  return *b;
}

void Device::begin_capture() {
  if (capture_support() == Capture::None)
    throw runtime_error("begin_capture on " + name() + ", which cannot capture work", "CUDA graphs need --device cuda");
  TESSERA_CHECK(!capturing_, "begin_capture on " + name() + ": a capture is already open");
  start_recording();
  capturing_ = true;
}

uint64_t Device::end_capture(bool keep) {
  TESSERA_CHECK(capturing_, "end_capture on " + name() + " without begin_capture");
  capturing_ = false;
  return stop_recording(keep);
}

bool Device::replay(uint64_t id) {
  throw runtime_error("replay of capture " + std::to_string(id) + " on " + name() + ": this device records nothing",
                      "only a device whose capture_support() is Replay (CUDA) replays");
}

void Device::refuse_while_capturing(const char* call) const {
  if (!capturing_) return;
  throw runtime_error(std::string(call) + " on " + name() +
                          " inside a captured step (--enable-cuda-graph): a replay would not repeat it",
                      "the captured region (the step between the batch upload and the loss read-back) must only "
                      "enqueue device work; run without --enable-cuda-graph, and report the call");
}

void Device::account(ptrdiff_t delta) {
  const size_t now = allocated_.fetch_add(static_cast<size_t>(delta), std::memory_order_relaxed) + delta;
  size_t peak = peak_.load(std::memory_order_relaxed);
  while (now > peak && !peak_.compare_exchange_weak(peak, now, std::memory_order_relaxed)) {
  }
}

void* Device::allocate_pinned(size_t bytes) {
  if (bytes == 0) return nullptr;
  void* p = std::aligned_alloc(64, (bytes + 63) / 64 * 64);
  if (!p) throw runtime_error("out of host memory: " + name() + " asked for " + std::to_string(bytes >> 20) +
                              " MiB of pinned staging memory");
  return p;
}
void Device::free_pinned(void* host, size_t) { std::free(host); }

void Device::copy_to_host_async(void* dst, const void* src, size_t src_offset, size_t bytes, Stream) {
  copy_to_host(dst, src, src_offset, bytes);
}
void Device::copy_from_host_async(void* dst, size_t dst_offset, const void* src, size_t bytes, Stream) {
  copy_from_host(dst, dst_offset, src, bytes);
}

void copy_to_host(void* dst, size_t dst_capacity, Tensor src) {
  TESSERA_CHECK(src.bytes() <= dst_capacity, "copy_to_host: " + std::to_string(src.bytes()) +
                                                 " bytes into a host buffer of " + std::to_string(dst_capacity));
  if (src.bytes() == 0) return;
  src.device->count_host_read();
  src.device->copy_to_host(dst, src.handle, src.offset, src.bytes());
}

void copy_from_host(Tensor dst, const void* src, size_t src_bytes) {
  TESSERA_CHECK(src_bytes == dst.bytes(), "copy_from_host: " + std::to_string(src_bytes) + " bytes into a " +
                                              shape_str(dst.shape) + " tensor");
  if (src_bytes == 0) return;
  dst.device->copy_from_host(dst.handle, dst.offset, src, src_bytes);
}

namespace {

void check_float_count(const Tensor& t, size_t count, const char* what) {
  TESSERA_CHECK(t.dtype == DType::F32 || t.dtype == DType::BF16 || t.dtype == DType::F16,
                std::string(what) + ": a " + std::string(dtype_name(t.dtype)) + " tensor holds no floats");
  TESSERA_CHECK(count == static_cast<size_t>(t.numel()),
                std::string(what) + ": " + std::to_string(count) + " values for a " + shape_str(t.shape) + " tensor");
}

}  // namespace

void copy_floats_from_host(Tensor dst, const float* src, size_t count) {
  check_float_count(dst, count, "copy_floats_from_host");
  if (dst.dtype == DType::F32) return copy_from_host(dst, src, count * sizeof(float));
  std::vector<uint16_t> bits(count);
  round_to_16bit(src, count, dst.dtype, bits.data());
  copy_from_host(dst, bits.data(), count * sizeof(uint16_t));
}

void copy_floats_to_host(float* dst, size_t count, Tensor src) {
  check_float_count(src, count, "copy_floats_to_host");
  if (src.dtype == DType::F32) return copy_to_host(dst, count * sizeof(float), src);
  std::vector<uint16_t> bits(count);
  copy_to_host(bits.data(), count * sizeof(uint16_t), src);
  widen_16bit(bits.data(), count, src.dtype, dst);
}

void copy_tensor(Tensor dst, Tensor src) {
  TESSERA_CHECK(dst.device == src.device && dst.bytes() == src.bytes(),
                "copy_tensor: " + shape_str(src.shape) + " into " + shape_str(dst.shape) + " (same device and size)");
  if (dst.bytes() == 0) return;
  dst.device->copy(dst.handle, dst.offset, src.handle, src.offset, src.bytes());
}

void fill_zero(Tensor t) {
  if (t.bytes() == 0) return;
  t.device->fill_zero(t.handle, t.offset, t.bytes());
}

}  // namespace tessera
