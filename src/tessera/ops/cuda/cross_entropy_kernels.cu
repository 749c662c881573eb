#include "tessera/ops/cuda/cross_entropy_kernels.h"

#include "tessera/ops/cuda/element_math.h"
#include "tessera/ops/cuda/typed_access.cuh"

namespace tessera::ops::cuda::native {
namespace {

constexpr int kThreads = 256;

// Block (x, n) covers vectors [x * kThreads, (x + 1) * kThreads) of row n (blockIdx.y, then
// blockIdx.z for rows past 65535); each thread one vector of V logits.
template <typename T, int V>
__global__ void cross_entropy_grad_kernel(CrossEntropyGradArgs a) {
  const int64_t n = static_cast<int64_t>(blockIdx.z) * 65535 + blockIdx.y;
  const int64_t v0 = (static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x) * V;
  if (n >= a.N || v0 >= a.V) return;
  const int64_t i = n * a.V + v0, target = a.targets[n] - a.vocab_start;
  const float lse = a.logsumexp[n], d = a.dlosses[n];
  float x[V], g[V];
  load<T, V>(x, static_cast<const T*>(a.logits), i);
  if (a.assign)
    for (int k = 0; k < V; ++k) g[k] = 0.0f;
  else
    load<T, V>(g, static_cast<const T*>(a.dlogits), i);
  for (int k = 0; k < V; ++k) g[k] += cross_entropy_grad(x[k], lse, d, v0 + k == target);
  store<T, V>(static_cast<T*>(a.dlogits), i, g);
}

template <typename T>
void grad_typed(const CrossEntropyGradArgs& a, cudaStream_t s) {
  constexpr int V = 16 / sizeof(T);
  const bool vec = vectorised<T>(a.V, {a.dlogits, a.logits});
  const int64_t per_row = vec ? a.V / V : a.V, x = (per_row + kThreads - 1) / kThreads;
  const dim3 grid(static_cast<unsigned>(x), static_cast<unsigned>(a.N < 65535 ? a.N : 65535),
                  static_cast<unsigned>((a.N + 65534) / 65535));
  if (vec)
    cross_entropy_grad_kernel<T, V><<<grid, kThreads, 0, s>>>(a);
  else
    cross_entropy_grad_kernel<T, 1><<<grid, kThreads, 0, s>>>(a);
}

}  // namespace

void cross_entropy_logit_grads(const CrossEntropyGradArgs& a, cudaStream_t stream) {
  if (a.N == 0 || a.V == 0) return;
  switch (a.dtype) {
    case DType::BF16: return grad_typed<__nv_bfloat16>(a, stream);
    case DType::F16: return grad_typed<__half>(a, stream);
    default: return grad_typed<float>(a, stream);
  }
}

}  // namespace tessera::ops::cuda::native
