#include "tessera/ops/cuda/cuda_launch.h"

#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "tessera/device/cuda/cuda_check.h"
#include "tessera/device/cuda/cuda_stream.h"
#include "tessera/ops/kernels/dropout_params.h"
#include "tessera/ops/kernels/float_args.h"

// The fatbin of kernels.cu, linked in as data by fatbin_data.cpp.
extern "C" const unsigned char tessera_cuda_fatbin[];

namespace tessera::ops::cuda {
namespace {

// The fatbin as a CUDA library (loaded once per process, for every GPU) and its kernels
// by name.
const void* find_kernel(const char* name) {
  static std::mutex lock;
  static cudaLibrary_t library = nullptr;
  static std::map<std::string, cudaKernel_t> kernels;
  std::lock_guard<std::mutex> guard(lock);
  if (!library)
    TESSERA_CUDA_CALL("the kernels of ops/cuda", cudaLibraryLoadData, &library, tessera_cuda_fatbin, nullptr,
                      nullptr, 0, nullptr, nullptr, 0);
  auto it = kernels.find(name);
  if (it == kernels.end()) {
    cudaKernel_t k = nullptr;
    TESSERA_CUDA_CALL(std::string("kernel ") + name, cudaLibraryGetKernel, &k, library, name);
    it = kernels.emplace(name, k).first;
  }
  return reinterpret_cast<const void*>(it->second);
}

// Per device: the scratch buffer and its lock.
struct Scratch {
  std::mutex lock;
  void* data = nullptr;
  size_t bytes = 0;
};

Scratch& scratch_of(const Device& device) {
  static std::mutex lock;
  static auto* scratches = new std::map<const Device*, Scratch>();  // leaked: see cuda_device.cpp
  std::lock_guard<std::mutex> guard(lock);
  return (*scratches)[&device];
}

}  // namespace

uint64_t element_offset(const Tensor& t) {
  const size_t size = dtype_size(t.dtype);
  TESSERA_CHECK(t.offset % size == 0, "CUDA tensor at byte offset " + std::to_string(t.offset) +
                                          ", not a multiple of its element size");
  return t.offset / size;
}

CudaLaunch::CudaLaunch(const Tensor& on, const char* kernel) : device_(*on.device), name_(kernel) {
  tessera::cuda::activate(device_);
  kernel_ = find_kernel(kernel);
}

void CudaLaunch::set(const void* value, size_t size) {
  TESSERA_CHECK(count_ < kMaxArgs,
                std::string(name_) + ": more than " + std::to_string(kMaxArgs) + " kernel arguments");
  values_[count_] = 0;
  std::memcpy(&values_[count_], value, size);
  args_[count_] = &values_[count_];
  ++count_;
}

CudaLaunch& CudaLaunch::tensor(const Tensor& t) {
  pointer(t.empty() ? nullptr : t.handle);
  return scalar<uint64_t>(t.empty() ? 0 : element_offset(t));
}

CudaLaunch& CudaLaunch::floats(const Tensor& t) {
  TESSERA_CHECK(t.empty() || is_floating(t.dtype), std::string(name_) + " given a tensor of dtype " +
                                                       std::string(dtype_name(t.dtype)) + " for a floating argument");
  return tensor(t).scalar<int32_t>(float_code(t));
}

CudaLaunch& CudaLaunch::pointer(const void* p) { return scalar<const void*>(p); }

CudaLaunch& CudaLaunch::dropout(const Dropout& d) {
  check_dropout_iteration(d, device_);
  return push_dropout_params(*this, d);
}

void CudaLaunch::run(int64_t global0, int64_t global1) {
  if (global0 == 0 || global1 == 0) return;
  // Blocks of the largest power of two up to 256 that divides global0, so the grid covers
  // [0, global0) exactly (prelude_cuda.cuh).
  const int64_t block = std::min<int64_t>(256, global0 & -global0);
  TESSERA_CHECK(global0 / block <= INT32_MAX, std::string(name_) + ": " + std::to_string(global0) +
                                                   " work-items in blocks of " + std::to_string(block));
  // global1 as gridDim.y x gridDim.z, each at most 65535.
  int64_t y = global1;
  if (y > 65535) {
    y = 65535;
    while (y > 1 && (global1 % y != 0 || global1 / y > 65535)) --y;
    TESSERA_CHECK(global1 % y == 0 && global1 / y <= 65535,
                  std::string(name_) + ": " + std::to_string(global1) + " rows do not split into a CUDA grid");
  }
  const dim3 grid(static_cast<unsigned>(global0 / block), static_cast<unsigned>(y),
                  static_cast<unsigned>(global1 / y));
  TESSERA_CUDA_CALL(std::string(name_) + " on " + device_.name(), cudaLaunchKernel, kernel_, grid,
                    dim3(static_cast<unsigned>(block)), args_, 0, tessera::cuda::stream_of(device_));
}

cudaStream_t stream_of(const Tensor& t) {
  tessera::cuda::activate(*t.device);
  return tessera::cuda::stream_of(*t.device);
}

ScratchLease::ScratchLease(Device& device, size_t bytes) {
  Scratch& s = scratch_of(device);
  lock_ = std::unique_lock<std::mutex>(s.lock);
  if (s.bytes < bytes) {
    // The old buffer may still be read by enqueued work.
    device.synchronize();
    device.free(s.data, s.bytes);
    s.data = device.allocate(bytes);
    s.bytes = bytes;
  }
  data_ = s.data;
}


}  // namespace tessera::ops::cuda
