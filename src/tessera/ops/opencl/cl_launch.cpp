#include "tessera/ops/opencl/cl_launch.h"

#include <algorithm>
#include <string>

#include "tessera/device/opencl/opencl_device.h"
#include "tessera/ops/kernels/dropout_params.h"
#include "tessera/ops/kernels/float_args.h"

namespace tessera::ops::opencl {

// Generated from kernels/*.cl by cmake/embed_text.cmake (see ops/opencl/CMakeLists.txt).
extern const char* const kOpsSources[];
extern const int kOpsSources_count;
extern const char* const kFp64Sources[];
extern const int kFp64Sources_count;

namespace {

// Division and sqrt correctly rounded, as on the CPU (OpenCL's default allows 2.5-3 ulp);
// no fast-math flags, since the kernels rely on inf and NaN.
constexpr const char* kBuildOptions = "-cl-std=CL1.2 -cl-fp32-correctly-rounded-divide-sqrt";

}  // namespace

ClContext& context_of(const Tensor& t) {
  TESSERA_CHECK(t.device != nullptr, "OpenCL op given a tensor without a device");
  return opencl_context(*t.device);
}

cl_mem cl_buffer(const Tensor& t) { return static_cast<cl_mem>(t.handle); }

uint64_t cl_offset(const Tensor& t) {
  const size_t size = dtype_size(t.dtype);
  TESSERA_CHECK(t.offset % size == 0, "OpenCL tensor at byte offset " + std::to_string(t.offset) +
                                          ", not a multiple of its element size");
  return t.offset / size;
}

ClLaunch::ClLaunch(ClContext& cl, const char* kernel)
    : ClLaunch(cl, cl.kernel("tessera_ops", kOpsSources, kOpsSources_count, kBuildOptions, kernel)) {}

ClLaunch ClLaunch::fp64(ClContext& cl, const char* kernel) {
  TESSERA_CHECK(cl.info().fp64, std::string(kernel) + " needs cl_khr_fp64, which " + cl.where() + " lacks");
  return ClLaunch(cl, cl.kernel("tessera_fp64", kFp64Sources, kFp64Sources_count, kBuildOptions, kernel));
}

ClLaunch::ClLaunch(ClContext& cl, tessera::opencl::ClKernel& k) : cl_(cl), kernel_(k), lock_(k.lock) {}

void ClLaunch::set(size_t size, const void* value) {
  TESSERA_CL(cl_.where() + ", kernel " + kernel_.name + " argument " + std::to_string(next_), clSetKernelArg,
             kernel_.kernel, next_, size, value);
  ++next_;
}

ClLaunch& ClLaunch::tensor(const Tensor& t) {
  buffer(cl_buffer(t));
  return scalar<cl_ulong>(t.empty() ? 0 : cl_offset(t));
}

ClLaunch& ClLaunch::floats(const Tensor& t) {
  TESSERA_CHECK(t.empty() || is_floating(t.dtype), "an OpenCL kernel given a tensor of dtype " +
                                                       std::string(dtype_name(t.dtype)) + " for a floating argument");
  return tensor(t).scalar<cl_int>(float_code(t));
}

ClLaunch& ClLaunch::buffer(cl_mem mem) {
  set(sizeof(cl_mem), &mem);
  return *this;
}

ClLaunch& ClLaunch::dropout(const Dropout& d) {
  if (!d.iteration.empty()) {
    check_dropout_iteration(d, *d.iteration.device);
    TESSERA_CHECK(&context_of(d.iteration) == &cl_, "dropout: the iteration scalar is not on " + cl_.where());
  }
  return push_dropout_params(*this, d);
}

void ClLaunch::run(size_t global0, size_t global1) {
  if (global0 == 0 || global1 == 0) return;
  const size_t global[2] = {global0, global1};
  // Work-groups of the largest power of two up to kMaxWorkGroup that divides global0, one row
  // of global1 each (CUDA's launcher does the same). Left to the implementation, PoCL picks
  // groups of up to 4096 work-items and keeps each one's private arrays (the attention
  // kernels' rows of MAX_HD floats, 4-5 KB) on its worker thread's stack: a 280 x 8 group
  // overflowed an 8 MB stack. No kernel uses local memory or barriers, so the group size
  // changes no result.
  constexpr size_t kMaxWorkGroup = 64;
  const size_t local[2] = {std::min(kMaxWorkGroup, global0 & (~global0 + 1)), 1};
  TESSERA_CL(cl_.where() + ", kernel " + kernel_.name + " over " + std::to_string(global0) + " x " +
                 std::to_string(global1),
             clEnqueueNDRangeKernel, cl_.queue(), kernel_.kernel, global1 == 1 ? 1u : 2u, nullptr, global, local, 0,
             nullptr, nullptr);
}

ClScratch::ClScratch(ClContext& cl, size_t bytes) : cl_(cl), mem_(cl.create_buffer(bytes > 0 ? bytes : 4)) {}
ClScratch::~ClScratch() { cl_.release_buffer(mem_); }

}  // namespace tessera::ops::opencl
