#include "tessera/ops/cuda/moe_kernels.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "tessera/ops/cuda/block_reduce.cuh"
#include "tessera/ops/cuda/typed_access.cuh"

namespace tessera::ops::cuda::native {
namespace {

constexpr int kThreads = 128;
template <typename T>
constexpr int kVector = 16 / sizeof(T);  // elements of a 128-bit access

// Block b is row b; thread x walks vectors x, x + kThreads, ... of the row's C / V.
#define FOR_VECTORS(C, V) for (int64_t c = static_cast<int64_t>(threadIdx.x) * (V); c < (C); c += kThreads * (V))

template <typename T, int V>
__global__ void permute_forward_kernel(T* out, const T* inp, const int32_t* sources, int64_t C, int64_t k) {
  const int64_t m = blockIdx.x;
  const int32_t r = sources[m];
  FOR_VECTORS(C, V) {
    float x[V] = {};
    if (r >= 0) load<T, V>(x, inp, r / k * C + c);
    store<T, V>(out, m * C + c, x);
  }
}

template <typename T, int V>
__global__ void permute_backward_kernel(T* dinp, const T* dout, const int32_t* slots, int64_t C, int64_t k,
                                        bool assign) {
  const int64_t n = blockIdx.x;
  FOR_VECTORS(C, V) {
    float d[V] = {}, g[V];
    if (!assign) load<T, V>(d, dinp, n * C + c);
    for (int64_t j = 0; j < k; ++j) {
      const int32_t m = slots[n * k + j];
      if (m < 0) continue;
      load<T, V>(g, dout, m * C + c);
      for (int i = 0; i < V; ++i) d[i] += g[i];
    }
    store<T, V>(dinp, n * C + c, d);
  }
}

template <typename T, int V>
__global__ void unpermute_forward_kernel(T* out, const T* inp, const int32_t* slots, const float* weights, int64_t C,
                                         int64_t k) {
  const int64_t n = blockIdx.x;
  FOR_VECTORS(C, V) {
    float o[V] = {}, x[V];
    for (int64_t j = 0; j < k; ++j) {
      const int32_t m = slots[n * k + j];
      if (m < 0) continue;
      const float w = weights[n * k + j];
      load<T, V>(x, inp, m * C + c);
      for (int i = 0; i < V; ++i) o[i] += w * x[i];
    }
    store<T, V>(out, n * C + c, o);
  }
}

// dweights was zeroed first; each route has at most one row, so each is written once.
template <typename T, int V>
__global__ void unpermute_backward_kernel(T* dinp, float* dweights, const T* dout, const T* inp,
                                          const int32_t* sources, const float* weights, int64_t C, int64_t k) {
  const int64_t m = blockIdx.x;
  const int32_t r = sources[m];
  const float w = r >= 0 ? weights[r] : 0.0f;
  float dot = 0.0f;
  FOR_VECTORS(C, V) {
    float g[V] = {}, x[V], d[V];
    if (r >= 0) {
      load<T, V>(g, dout, r / k * C + c);
      load<T, V>(x, inp, m * C + c);
      for (int i = 0; i < V; ++i) dot += g[i] * x[i];
    }
    for (int i = 0; i < V; ++i) d[i] = w * g[i];
    store<T, V>(dinp, m * C + c, d);
  }
  dot = block_reduce(dot, false);  // every thread of the block, whatever its row
  if (r >= 0 && threadIdx.x == 0) dweights[r] = dot;
}

#undef FOR_VECTORS

// Launches kernel over `rows` blocks (the caller picks its vector width).
template <typename Kernel, typename... Args>
void launch_rows(Kernel kernel, int64_t rows, cudaStream_t s, Args... args) {
  if (rows > 0) kernel<<<static_cast<unsigned>(rows), kThreads, 0, s>>>(args...);
}

// T for the call's dtype.
template <typename F>
void by_dtype(DType dtype, F f) {
  switch (dtype) {
    case DType::BF16: return f(__nv_bfloat16{});
    case DType::F16: return f(__half{});
    default: return f(float{});
  }
}

}  // namespace

void moe_permute_forward(const MoeRows& r, void* out, const void* inp, cudaStream_t s) {
  by_dtype(r.dtype, [&](auto t) {
    using T = decltype(t);
    const bool vec = vectorised<T>(r.C, {out, inp});
    launch_rows(vec ? permute_forward_kernel<T, kVector<T>> : permute_forward_kernel<T, 1>, r.M, s,
                static_cast<T*>(out), static_cast<const T*>(inp), r.sources, r.C, r.k);
  });
}

void moe_permute_backward(const MoeRows& r, void* dinp, const void* dout, bool assign, cudaStream_t s) {
  by_dtype(r.dtype, [&](auto t) {
    using T = decltype(t);
    const bool vec = vectorised<T>(r.C, {dinp, dout});
    launch_rows(vec ? permute_backward_kernel<T, kVector<T>> : permute_backward_kernel<T, 1>, r.N, s,
                static_cast<T*>(dinp), static_cast<const T*>(dout), r.slots, r.C, r.k, assign);
  });
}

void moe_unpermute_forward(const MoeRows& r, void* out, const void* inp, const float* weights, cudaStream_t s) {
  by_dtype(r.dtype, [&](auto t) {
    using T = decltype(t);
    const bool vec = vectorised<T>(r.C, {out, inp});
    launch_rows(vec ? unpermute_forward_kernel<T, kVector<T>> : unpermute_forward_kernel<T, 1>, r.N, s,
                static_cast<T*>(out), static_cast<const T*>(inp), r.slots, weights, r.C, r.k);
  });
}

void moe_unpermute_backward(const MoeRows& r, void* dinp, float* dweights, const void* dout, const void* inp,
                            const float* weights, cudaStream_t s) {
  by_dtype(r.dtype, [&](auto t) {
    using T = decltype(t);
    const bool vec = vectorised<T>(r.C, {dinp, dout, inp});
    launch_rows(vec ? unpermute_backward_kernel<T, kVector<T>> : unpermute_backward_kernel<T, 1>, r.M, s,
                static_cast<T*>(dinp), dweights, static_cast<const T*>(dout), static_cast<const T*>(inp), r.sources,
                weights, r.C, r.k);
  });
}

}  // namespace tessera::ops::cuda::native
