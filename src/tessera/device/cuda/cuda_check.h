// Checked CUDA runtime calls: every failure names the call, CUDA's error name and text and
// the device, e.g. "cudaMalloc failed with cudaErrorMemoryAllocation (out of memory) on
// cuda:0 (NVIDIA H200) for 80 GiB". Only the sources of device/cuda, ops/cuda and
// comm/nccl include <cuda_runtime.h> (see docs/backends.md).
#pragma once

#include <cuda_runtime.h>

#include <string>

namespace tessera::cuda {

// Throws tessera::Error (runtime): "<call> failed with <name> (<text>) on <where>".
[[noreturn]] void cuda_call_failed(const char* call, cudaError_t code, const std::string& where);

}  // namespace tessera::cuda

// TESSERA_CUDA_CALL(where, cudaFunction, args...): calls cudaFunction(args...) and throws
// naming it when it does not return cudaSuccess. `where` says which device and what sizes.
#define TESSERA_CUDA_CALL(where, fn, ...)                                  \
  do {                                                                     \
    const cudaError_t tessera_cuda_err_ = fn(__VA_ARGS__);                 \
    if (tessera_cuda_err_ != cudaSuccess)                                  \
      ::tessera::cuda::cuda_call_failed(#fn, tessera_cuda_err_, (where));  \
  } while (0)
