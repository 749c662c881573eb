// The typed loads and stores of the native kernels (swiglu_kernels.cu, norm_kernels.cu, ...):
// V consecutive elements of a float, bf16 or f16 tensor as floats, in one 128-bit access
// when V elements fill it (the caller checks the alignment with `vectorised`), rounded to
// nearest even on the way back.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <initializer_list>

namespace tessera::ops::cuda::native {

__device__ inline float to_float(float x) { return x; }
__device__ inline float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }
__device__ inline float to_float(__half x) { return __half2float(x); }
template <typename T>
__device__ inline T from_float(float x);
template <>
__device__ inline float from_float<float>(float x) { return x; }
template <>
__device__ inline __nv_bfloat16 from_float<__nv_bfloat16>(float x) { return __float2bfloat16_rn(x); }
template <>
__device__ inline __half from_float<__half>(float x) { return __float2half_rn(x); }

// x[k] = p[i + k], k < V.
template <typename T, int V>
__device__ inline void load(float (&x)[V], const T* p, int64_t i) {
  alignas(16) T v[V];
  if constexpr (V * sizeof(T) == 16)
    *reinterpret_cast<uint4*>(v) = *reinterpret_cast<const uint4*>(p + i);
  else
    for (int k = 0; k < V; ++k) v[k] = p[i + k];
  for (int k = 0; k < V; ++k) x[k] = to_float(v[k]);
}

// p[i + k] = x[k], k < V.
template <typename T, int V>
__device__ inline void store(T* p, int64_t i, const float (&x)[V]) {
  alignas(16) T v[V];
  for (int k = 0; k < V; ++k) v[k] = from_float<T>(x[k]);
  if constexpr (V * sizeof(T) == 16)
    *reinterpret_cast<uint4*>(p + i) = *reinterpret_cast<const uint4*>(v);
  else
    for (int k = 0; k < V; ++k) p[i + k] = v[k];
}

// Element i of a tensor as a float, and a float stored into it rounded once: the accessors the
// items of rope_math.h and embedding_math.h take.
template <typename T>
struct ElementReader {
  const T* p;
  __device__ float operator()(int64_t i) const { return to_float(p[i]); }
};
template <typename T>
struct ElementWriter {
  T* p;
  __device__ void operator()(int64_t i, float v) const { p[i] = from_float<T>(v); }
};

// Whether rows of `width` elements of T start on 128-bit vectors: width a multiple of the
// vector and every pointer (null ones aside) 16-byte aligned.
template <typename T>
bool vectorised(int64_t width, std::initializer_list<const void*> pointers) {
  if (width % static_cast<int64_t>(16 / sizeof(T)) != 0) return false;
  for (const void* p : pointers)
    if (reinterpret_cast<uintptr_t>(p) % 16 != 0) return false;
  return true;
}

}  // namespace tessera::ops::cuda::native
