#include "tessera/ops/cuda/norm_kernels.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <initializer_list>

#include "tessera/ops/cuda/block_reduce.cuh"
#include "tessera/ops/cuda/typed_access.cuh"

namespace tessera::ops::cuda::native {
namespace {

constexpr int64_t kMaxRowBytes = 48 * 1024;  // the staged row, without opting in to more

// Block n normalises row n; thread t takes the row's vectors t, t + blockDim.x, ...
template <typename T, int V>
__global__ void norm_forward_kernel(NormArgs a, T* out, float eps) {
  extern __shared__ float row[];
  const int64_t n = blockIdx.x, x = n * a.C, vectors = a.C / V;
  const T* inp = static_cast<const T*>(a.inp);
  float sum = 0.0f;
  for (int64_t j = threadIdx.x; j < vectors; j += blockDim.x) {
    float v[V];
    load<T, V>(v, inp, x + j * V);
    for (int k = 0; k < V; ++k) {
      row[j * V + k] = v[k];
      sum += v[k];
    }
  }
  // Each thread reads back only the vectors it staged: no barrier before block_reduce's.
  const float mu = a.rms ? 0.0f : block_reduce(sum, false) / static_cast<float>(a.C);
  float sq = 0.0f;
  for (int64_t j = threadIdx.x; j < vectors; j += blockDim.x)
    for (int k = 0; k < V; ++k) {
      const float d = row[j * V + k] - mu;
      sq += d * d;
    }
  const float rs = 1.0f / sqrtf(block_reduce(sq, false) / static_cast<float>(a.C) + eps);
  const T* weight = static_cast<const T*>(a.weight);
  const T* bias = static_cast<const T*>(a.bias);
  for (int64_t j = threadIdx.x; j < vectors; j += blockDim.x) {
    float w[V], b[V] = {}, y[V];
    load<T, V>(w, weight, j * V);
    if (bias) load<T, V>(b, bias, j * V);
    for (int k = 0; k < V; ++k) y[k] = (row[j * V + k] - mu) * rs * w[k] + b[k];
    store<T, V>(out, x + j * V, y);
  }
  if (threadIdx.x == 0 && a.mean && !a.rms) a.mean[n] = mu;
  if (threadIdx.x == 0 && a.rstd) a.rstd[n] = rs;
}

template <typename T, int V>
__global__ void norm_backward_input_kernel(NormArgs a, T* dinp, const T* dout, bool assign) {
  const int64_t n = blockIdx.x, x = n * a.C, vectors = a.C / V;
  const T* inp = static_cast<const T*>(a.inp);
  const T* weight = static_cast<const T*>(a.weight);
  const float m = a.rms ? 0.0f : a.mean[n], r = a.rstd[n];
  float g_sum = 0.0f, gx_sum = 0.0f;
  for (int64_t j = threadIdx.x; j < vectors; j += blockDim.x) {
    float dy[V], w[V], v[V];
    load<T, V>(dy, dout, x + j * V);
    load<T, V>(w, weight, j * V);
    load<T, V>(v, inp, x + j * V);
    for (int k = 0; k < V; ++k) {
      const float g = dy[k] * w[k];
      g_sum += g;
      gx_sum += g * ((v[k] - m) * r);
    }
  }
  const float g_mean = a.rms ? 0.0f : block_reduce(g_sum, false) / static_cast<float>(a.C);
  const float gx_mean = block_reduce(gx_sum, false) / static_cast<float>(a.C);
  for (int64_t j = threadIdx.x; j < vectors; j += blockDim.x) {
    float dy[V], w[V], v[V], d[V];
    load<T, V>(dy, dout, x + j * V);
    load<T, V>(w, weight, j * V);
    load<T, V>(v, inp, x + j * V);
    if (assign)
      for (int k = 0; k < V; ++k) d[k] = 0.0f;
    else
      load<T, V>(d, dinp, x + j * V);
    for (int k = 0; k < V; ++k) d[k] += (dy[k] * w[k] - g_mean - (v[k] - m) * r * gx_mean) * r;
    store<T, V>(dinp, x + j * V, d);
  }
}

// Threads per row: a warp per 32 vectors, at most 512 (GPT-2's C = 768 in bf16: 96).
unsigned row_threads(int64_t vectors) {
  const int64_t t = (vectors + 31) / 32 * 32;
  return static_cast<unsigned>(t < 32 ? 32 : t > 512 ? 512 : t);
}

template <typename T>
void forward_typed(const NormArgs& a, void* out, float eps, cudaStream_t s) {
  constexpr int V = 16 / sizeof(T);
  const size_t shared = static_cast<size_t>(a.C) * sizeof(float);
  auto* o = static_cast<T*>(out);
  if (vectorised<T>(a.C, {out, a.inp, a.weight, a.bias}))
    norm_forward_kernel<T, V><<<static_cast<unsigned>(a.N), row_threads(a.C / V), shared, s>>>(a, o, eps);
  else
    norm_forward_kernel<T, 1><<<static_cast<unsigned>(a.N), row_threads(a.C), shared, s>>>(a, o, eps);
}

template <typename T>
void backward_typed(const NormArgs& a, void* dinp, const void* dout, bool assign, cudaStream_t s) {
  constexpr int V = 16 / sizeof(T);
  auto* d = static_cast<T*>(dinp);
  const auto* dy = static_cast<const T*>(dout);
  if (vectorised<T>(a.C, {dinp, dout, a.inp, a.weight}))
    norm_backward_input_kernel<T, V><<<static_cast<unsigned>(a.N), row_threads(a.C / V), 0, s>>>(a, d, dy, assign);
  else
    norm_backward_input_kernel<T, 1><<<static_cast<unsigned>(a.N), row_threads(a.C), 0, s>>>(a, d, dy, assign);
}

}  // namespace

bool norm_serves(int64_t C) { return C > 0 && C * static_cast<int64_t>(sizeof(float)) <= kMaxRowBytes; }

void norm_forward(const NormArgs& a, void* out, float eps, cudaStream_t stream) {
  if (a.N == 0) return;
  switch (a.dtype) {
    case DType::BF16: return forward_typed<__nv_bfloat16>(a, out, eps, stream);
    case DType::F16: return forward_typed<__half>(a, out, eps, stream);
    default: return forward_typed<float>(a, out, eps, stream);
  }
}

void norm_backward_input(const NormArgs& a, void* dinp, const void* dout, bool assign, cudaStream_t stream) {
  if (a.N == 0) return;
  switch (a.dtype) {
    case DType::BF16: return backward_typed<__nv_bfloat16>(a, dinp, dout, assign, stream);
    case DType::F16: return backward_typed<__half>(a, dinp, dout, assign, stream);
    default: return backward_typed<float>(a, dinp, dout, assign, stream);
  }
}

}  // namespace tessera::ops::cuda::native
