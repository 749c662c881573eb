// Launching tessera's OpenCL C kernels (kernels/*.cl, compiled into the binary) from the
// host functions of ops/opencl:
//
//   ClLaunch(out, "residual_forward").tensor(out).tensor(a).tensor(b).run(n);
//
// Each tensor becomes two kernel arguments, its cl_mem (null when the tensor is empty:
// "absent") and its offset in elements, a floating one (floats()) a third, its dtype
// code; scalars must have the exact C++ type of the
// kernel's parameter (int64_t for long, uint32_t for uint, ...). The kernel's arguments
// are locked from construction to run(), since in-process ranks share the kernels.
#pragma once

#include <cstdint>
#include <mutex>
#include <string>

#include "tessera/core/tensor.h"
#include "tessera/device/device.h"
#include "tessera/device/opencl/cl_context.h"
#include "tessera/ops/ops.h"

namespace tessera::ops::opencl {

using tessera::opencl::ClContext;

// The OpenCL state of the device `t` lives on.
ClContext& context_of(const Tensor& t);

// The cl_mem of a tensor (nullptr when empty).
cl_mem cl_buffer(const Tensor& t);
// Its offset in elements (the byte offset must be a multiple of the element size).
uint64_t cl_offset(const Tensor& t);

class ClLaunch {
 public:
  static constexpr const char* kBackend = "OpenCL";  // for messages

  // `kernel` of the program of all kernels but sum_squares (built on first use).
  ClLaunch(ClContext& cl, const char* kernel);
  ClLaunch(const Tensor& on, const char* kernel) : ClLaunch(context_of(on), kernel) {}
  // sum_squares_lanes, from the program that needs cl_khr_fp64.
  static ClLaunch fp64(ClContext& cl, const char* kernel);

  ClLaunch& tensor(const Tensor& t);
  // A floating tensor (kernels/dtype.cl's FLOATS): tensor(t), then its dtype code.
  ClLaunch& floats(const Tensor& t);
  ClLaunch& buffer(cl_mem mem);  // a scratch buffer (no offset argument)
  template <typename T>
  ClLaunch& scalar(T value) {
    set(sizeof(T), &value);
    return *this;
  }
  // ops.h's Dropout as the kernels' DROPOUT_PARAMS (p, 1/(1-p), seed, site, iteration, the
  // iteration scalar's buffer and offset (null: none), sample0, element_offset).
  ClLaunch& dropout(const Dropout& d);

  // Enqueues the kernel over global0 x global1 work-items (nothing when either is 0).
  void run(size_t global0, size_t global1 = 1);

 private:
  ClLaunch(ClContext& cl, tessera::opencl::ClKernel& k);
  void set(size_t size, const void* value);
  ClContext& cl_;
  tessera::opencl::ClKernel& kernel_;
  std::unique_lock<std::mutex> lock_;
  cl_uint next_ = 0;
};

// A temporary device buffer for one op call (widened 16-bit GEMM operands, partial
// sums), released when it goes out of scope.
class ClScratch {
 public:
  ClScratch(ClContext& cl, size_t bytes);
  ~ClScratch();
  ClScratch(ClScratch&& o) noexcept : cl_(o.cl_), mem_(o.mem_) { o.mem_ = nullptr; }
  ClScratch(const ClScratch&) = delete;
  ClScratch& operator=(const ClScratch&) = delete;
  cl_mem mem() const { return mem_; }

 private:
  ClContext& cl_;
  cl_mem mem_;
};

// The launcher the shared host code (ops/kernels/*_host.inc) calls.
using Launch = ClLaunch;

}  // namespace tessera::ops::opencl
