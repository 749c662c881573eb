// The CUDA side of the shared kernel sources (ops/kernels/*.cl, written in OpenCL C):
// included before them by ops/cuda/kernels.cu, it maps OpenCL C's qualifiers, types,
// built-ins and work-item index onto CUDA, so the logic CUDA runs is the logic the OpenCL
// backend runs and PoCL checks in CI. prelude_opencl.cl is the OpenCL side.
//
// The NDRange: a kernel sees get_global_id(0) in [0, global0) and get_global_id(1) in
// [0, global1) exactly, as in OpenCL, because the launcher (ops/cuda/cuda_launch.cpp)
// picks a block size that divides global0 (the largest power of two up to 256 that does)
// and splits global1 over gridDim.y x gridDim.z exactly. So the shared kernels need no
// bounds checks; sizes that are not multiples of 32 run with small blocks (only tests use
// such sizes).
#pragma once

#include <math.h>  // INFINITY (nvcc includes the CUDA runtime itself)

typedef unsigned short ushort;
typedef unsigned int uint;
typedef unsigned long ulong;

#define __kernel extern "C" __global__
#define __global
#define DEVICE_FN __device__ inline

__device__ inline long get_global_id(int dim) {
  return dim == 0 ? (long)blockIdx.x * blockDim.x + threadIdx.x : (long)blockIdx.z * gridDim.y + blockIdx.y;
}

// OpenCL C's reinterpretations and 32-bit multiply-high.
__device__ inline int as_int(float x) { return __float_as_int(x); }
__device__ inline uint as_uint(float x) { return __float_as_uint(x); }
__device__ inline float as_float(int x) { return __int_as_float(x); }
__device__ inline float as_float(uint x) { return __uint_as_float(x); }
__device__ inline uint mul_hi(uint a, uint b) { return __umulhi(a, b); }
