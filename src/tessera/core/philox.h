// Counter-based random numbers (Philox4x32-10, Salmon et al. 2011) in the common subset of
// C++, OpenCL C and CUDA, so every backend draws the same bits from one source: the CPU
// kernels include it, the OpenCL programs have it prepended (ops/opencl/CMakeLists.txt), a
// CUDA kernel includes it. core/rng.h wraps it for C++ callers.
//
// Only what all three languages share: plain structs, fixed-width unsigned types through
// the typedefs below, 64-bit multiplies for the high halves, no overloads or references.
// TESSERA_DEVICE_FN marks a function callable from device code. Include guards rather than
// #pragma once: OpenCL compilers warn on the pragma in a source string.
#ifndef TESSERA_CORE_PHILOX_H
#define TESSERA_CORE_PHILOX_H

#if defined(__OPENCL_VERSION__)
#define TESSERA_DEVICE_FN
typedef uint tessera_u32;
typedef ulong tessera_u64;
#else
#include <math.h>
#include <stdint.h>
#if defined(__CUDACC__)
#define TESSERA_DEVICE_FN __host__ __device__ inline
#else
#define TESSERA_DEVICE_FN inline
#endif
typedef uint32_t tessera_u32;
typedef uint64_t tessera_u64;
#endif

// What a draw is for; part of the key so streams never overlap (core/rng.h RngStream).
#define TESSERA_RNG_STREAM_INIT 1u
#define TESSERA_RNG_STREAM_DROPOUT 2u

typedef struct {
  tessera_u32 v[4];
} tessera_philox4;

TESSERA_DEVICE_FN tessera_philox4 tessera_philox4x32(tessera_u32 key0, tessera_u32 key1, tessera_philox4 ctr) {
  for (int round = 0; round < 10; ++round) {
    const tessera_u64 p0 = (tessera_u64)0xD2511F53u * ctr.v[0];
    const tessera_u64 p1 = (tessera_u64)0xCD9E8D57u * ctr.v[2];
    tessera_philox4 next;
    next.v[0] = (tessera_u32)(p1 >> 32) ^ ctr.v[1] ^ key0;
    next.v[1] = (tessera_u32)p1;
    next.v[2] = (tessera_u32)(p0 >> 32) ^ ctr.v[3] ^ key1;
    next.v[3] = (tessera_u32)p0;
    ctr = next;
    key0 += 0x9E3779B9u;
    key1 += 0xBB67AE85u;
  }
  return ctr;
}

// Uniform in [0, 1) with 24 bits, from one 32-bit lane.
TESSERA_DEVICE_FN float tessera_uint_to_unit_float(tessera_u32 x) { return (float)(x >> 8) * (1.0f / 16777216.0f); }

// Standard normal for element `index` of parameter `tensor_id`, by Box-Muller on two lanes
// in double (devices need doubles: cl_khr_fp64 on OpenCL).
#if defined(__OPENCL_VERSION__) && defined(cl_khr_fp64)
#pragma OPENCL EXTENSION cl_khr_fp64 : enable
#endif
#if !defined(__OPENCL_VERSION__) || defined(cl_khr_fp64)
TESSERA_DEVICE_FN float tessera_philox_normal(tessera_u32 seed, tessera_u32 tensor_id, tessera_u64 index) {
  tessera_philox4 ctr;
  ctr.v[0] = (tessera_u32)index;
  ctr.v[1] = (tessera_u32)(index >> 32);
  ctr.v[2] = tensor_id;
  ctr.v[3] = 0;
  const tessera_philox4 r = tessera_philox4x32(seed, TESSERA_RNG_STREAM_INIT, ctr);
  // u1 in (0, 1] so the log is finite.
  const double u1 = ((double)r.v[0] + 1.0) / 4294967296.0;
  const double u2 = (double)r.v[1] / 4294967296.0;
  return (float)(sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2));
}
#endif

#endif  // TESSERA_CORE_PHILOX_H
