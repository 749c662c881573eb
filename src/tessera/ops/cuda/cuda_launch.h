// Launching the CUDA backend's kernels (kernels.cu: the shared sources of ops/kernels and
// the CUDA-only ones, compiled into one fatbin) from the host functions of ops/cuda:
//
//   CudaLaunch(out, "residual_forward").tensor(out).tensor(a).tensor(b).run(n);
//
// The OpenCL backend's ClLaunch, argument for argument: each tensor becomes its device
// pointer (null when the tensor is empty: "absent") and its offset in elements, a
// floating one (floats()) a third, its dtype code; scalars
// must have the exact C++ type of the kernel's parameter (int64_t for long, uint32_t for
// uint, ...). run(global0, global1) is OpenCL's NDRange, mapped exactly (prelude_cuda.cuh).
// Kernels go on the device's default stream.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <initializer_list>
#include <mutex>
#include <vector>

#include "tessera/core/tensor.h"
#include "tessera/device/device.h"
#include "tessera/ops/ops.h"

namespace tessera::ops::cuda {

// A tensor's offset in elements (the byte offset must be a multiple of the element size).
uint64_t element_offset(const Tensor& t);

// An F32 tensor's first element (null when empty).
inline float* f32(const Tensor& t) {
  return t.empty() ? nullptr : static_cast<float*>(t.handle) + element_offset(t);
}

// A tensor's first byte as T* (null when empty): what the native kernels take.
template <typename T = void>
T* memory(const Tensor& t) {
  return t.empty() ? nullptr : reinterpret_cast<T*>(static_cast<char*>(t.handle) + t.offset);
}

// The stream of the tensor's device (its default stream), with the device made current.
cudaStream_t stream_of(const Tensor& t);

class CudaLaunch {
 public:
  // Makes the tensor's device current and looks `kernel` up (loading the fatbin once).
  static constexpr const char* kBackend = "CUDA";  // for messages

  CudaLaunch(const Tensor& on, const char* kernel);

  CudaLaunch& tensor(const Tensor& t);
  // A floating tensor (kernels/dtype.cl's FLOATS): tensor(t), then its dtype code.
  CudaLaunch& floats(const Tensor& t);
  CudaLaunch& pointer(const void* p);  // a scratch buffer (no offset argument)
  template <typename T>
  CudaLaunch& scalar(T value) {
    static_assert(sizeof(T) <= sizeof(uint64_t), "kernel arguments are at most 8 bytes");
    set(&value, sizeof(T));
    return *this;
  }
  // ops.h's Dropout as the kernels' DROPOUT_PARAMS (common.cl).
  CudaLaunch& dropout(const Dropout& d);

  // Launches over global0 x global1 work-items (nothing when either is 0).
  void run(int64_t global0, int64_t global1 = 1);

 private:
  void set(const void* value, size_t size);
  static constexpr int kMaxArgs = 64;  // the widest shared kernel takes 44 (kernel_arguments_test.py)
  const Device& device_;
  const char* name_;
  const void* kernel_;
  uint64_t values_[kMaxArgs];
  void* args_[kMaxArgs];
  int count_ = 0;
};

// A device buffer reused by the ops of one device (16-bit GEMM operands, partial sums),
// grown when a call needs more. The lease holds the device's scratch lock until it goes
// out of scope: work on one stream runs in issue order, so the buffer is free again for
// the next op once this op's work is enqueued, but in-process ranks are threads that
// enqueue on the same device.
class ScratchLease {
 public:
  ScratchLease(Device& device, size_t bytes);
  void* data() const { return data_; }

 private:
  std::unique_lock<std::mutex> lock_;
  void* data_;
};

// One op's f32 temporaries (and widened 16-bit GEMM operands), carved out of the device's
// scratch: piece i of the sizes given, in bytes.
class Pieces {
 public:
  Pieces(Device& device, std::initializer_list<size_t> bytes) : offsets_(offsets(bytes)), lease_(device, offsets_.back()) {}
  void* operator[](size_t i) const { return static_cast<char*>(lease_.data()) + offsets_[i]; }

 private:
  // Where each piece starts (256-byte aligned, as cuBLASLt likes), then the total.
  static std::vector<size_t> offsets(std::initializer_list<size_t> bytes) {
    std::vector<size_t> r{0};
    for (size_t b : bytes) r.push_back(r.back() + (b + 255) / 256 * 256);
    return r;
  }
  std::vector<size_t> offsets_;
  ScratchLease lease_;
};

// The launcher the shared host code (ops/kernels/*_host.inc) calls.
using Launch = CudaLaunch;

}  // namespace tessera::ops::cuda
