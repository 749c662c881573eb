#include "tessera/ops/cuda/swiglu_kernels.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "tessera/ops/cuda/element_math.h"
#include "tessera/ops/cuda/typed_access.cuh"

namespace tessera::ops::cuda::native {
namespace {

constexpr int kThreads = 256;

// Thread j handles out elements [j V, j V + V) of [N, F] (F a multiple of V: one row).
template <typename T, int V>
__global__ void swiglu_forward_kernel(T* out, const T* inp, int64_t n, int64_t F) {
  for (int64_t i = (static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x) * V; i < n;
       i += static_cast<int64_t>(gridDim.x) * kThreads * V) {
    const int64_t gate_i = i / F * 2 * F + i % F;
    float gate[V], up[V], y[V];
    load<T, V>(gate, inp, gate_i);
    load<T, V>(up, inp, gate_i + F);
    for (int k = 0; k < V; ++k) y[k] = swiglu_value(gate[k], up[k]);
    store<T, V>(out, i, y);
  }
}

template <typename T, int V>
__global__ void swiglu_backward_kernel(T* dinp, const T* dout, const T* inp, int64_t n, int64_t F, bool assign) {
  for (int64_t i = (static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x) * V; i < n;
       i += static_cast<int64_t>(gridDim.x) * kThreads * V) {
    const int64_t gate_i = i / F * 2 * F + i % F;
    float gate[V], up[V], dy[V], dgate[V], dup[V];
    load<T, V>(gate, inp, gate_i);
    load<T, V>(up, inp, gate_i + F);
    load<T, V>(dy, dout, i);
    if (assign) {
      for (int k = 0; k < V; ++k) dgate[k] = dup[k] = 0.0f;
    } else {
      load<T, V>(dgate, dinp, gate_i);
      load<T, V>(dup, dinp, gate_i + F);
    }
    for (int k = 0; k < V; ++k) {
      const SwigluGrads g = swiglu_grads(gate[k], up[k], dy[k]);
      dgate[k] += g.dgate;
      dup[k] += g.dup;
    }
    store<T, V>(dinp, gate_i, dgate);
    store<T, V>(dinp, gate_i + F, dup);
  }
}

unsigned blocks_for(int64_t items) {
  const int64_t b = (items + kThreads - 1) / kThreads;
  return static_cast<unsigned>(b < 65535 * 8 ? b : 65535 * 8);  // then each thread loops
}

template <typename T>
void forward_typed(void* out, const void* inp, int64_t n, int64_t F, cudaStream_t s) {
  constexpr int V = 16 / sizeof(T);
  auto* o = static_cast<T*>(out);
  const auto* x = static_cast<const T*>(inp);
  if (vectorised<T>(F, {out, inp}))
    swiglu_forward_kernel<T, V><<<blocks_for(n / V), kThreads, 0, s>>>(o, x, n, F);
  else
    swiglu_forward_kernel<T, 1><<<blocks_for(n), kThreads, 0, s>>>(o, x, n, F);
}

template <typename T>
void backward_typed(void* dinp, const void* dout, const void* inp, int64_t n, int64_t F, bool assign,
                    cudaStream_t s) {
  constexpr int V = 16 / sizeof(T);
  auto* d = static_cast<T*>(dinp);
  const auto* dy = static_cast<const T*>(dout);
  const auto* x = static_cast<const T*>(inp);
  if (vectorised<T>(F, {dinp, dout, inp}))
    swiglu_backward_kernel<T, V><<<blocks_for(n / V), kThreads, 0, s>>>(d, dy, x, n, F, assign);
  else
    swiglu_backward_kernel<T, 1><<<blocks_for(n), kThreads, 0, s>>>(d, dy, x, n, F, assign);
}

}  // namespace

void swiglu_forward(DType dtype, void* out, const void* inp, int64_t N, int64_t F, cudaStream_t stream) {
  const int64_t n = N * F;
  if (n == 0) return;
  switch (dtype) {
    case DType::BF16: return forward_typed<__nv_bfloat16>(out, inp, n, F, stream);
    case DType::F16: return forward_typed<__half>(out, inp, n, F, stream);
    default: return forward_typed<float>(out, inp, n, F, stream);
  }
}

void swiglu_backward(DType dtype, void* dinp, const void* dout, const void* inp, int64_t N, int64_t F, bool assign,
                     cudaStream_t stream) {
  const int64_t n = N * F;
  if (n == 0) return;
  switch (dtype) {
    case DType::BF16: return backward_typed<__nv_bfloat16>(dinp, dout, inp, n, F, assign, stream);
    case DType::F16: return backward_typed<__half>(dinp, dout, inp, n, F, assign, stream);
    default: return backward_typed<float>(dinp, dout, inp, n, F, assign, stream);
  }
}

}  // namespace tessera::ops::cuda::native
