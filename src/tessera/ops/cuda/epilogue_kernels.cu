#include "tessera/ops/cuda/epilogue_kernels.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "tessera/ops/cuda/element_math.h"

namespace tessera::ops::cuda::native {
namespace {

constexpr int kThreads = 256;

__device__ inline float load(const float* p, int64_t i) { return p[i]; }
__device__ inline float load(const __nv_bfloat16* p, int64_t i) { return __bfloat162float(p[i]); }
__device__ inline float load(const __half* p, int64_t i) { return __half2float(p[i]); }
__device__ inline void store(float* p, int64_t i, float x) { p[i] = x; }
__device__ inline void store(__nv_bfloat16* p, int64_t i, float x) { p[i] = __float2bfloat16_rn(x); }
__device__ inline void store(__half* p, int64_t i, float x) { p[i] = __float2half_rn(x); }

template <typename T>
__global__ void dgelu_kernel(T* dpre, const T* dout, const T* pre, int64_t n, bool erf) {
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * kThreads)
    store(dpre, i, load(dout, i) * gelu_grad(load(pre, i), erf));
}

template <typename T>
__global__ void bias_dropout_add_grad_kernel(T* dinp, T* contrib, T* dresidual, const T* dout, int64_t n, bool assign,
                                             DropoutArgs d) {
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * kThreads) {
    const float g = load(dout, i);
    const float factor = d.p > 0.0f ? dropout_factor(d, i / d.per_sample, static_cast<uint64_t>(i % d.per_sample)) : 1.0f;
    const float c = g * factor;
    if (contrib) store(contrib, i, c);
    if (dinp) store(dinp, i, (assign ? 0.0f : load(dinp, i)) + c);
    if (dresidual) store(dresidual, i, (assign ? 0.0f : load(dresidual, i)) + g);
  }
}

unsigned blocks_for(int64_t n) {
  const int64_t b = (n + kThreads - 1) / kThreads;
  return static_cast<unsigned>(b < 65535 * 8 ? b : 65535 * 8);  // then each thread loops
}

template <typename T>
T* as(void* p) {
  return static_cast<T*>(p);
}
template <typename T>
const T* as(const void* p) {
  return static_cast<const T*>(p);
}

template <typename T>
void dgelu_typed(void* dpre, const void* dout, const void* pre, int64_t n, bool erf, cudaStream_t s) {
  dgelu_kernel<T><<<blocks_for(n), kThreads, 0, s>>>(as<T>(dpre), as<T>(dout), as<T>(pre), n, erf);
}

template <typename T>
void bda_typed(void* dinp, void* contrib, void* dresidual, const void* dout, int64_t n, bool assign,
               const DropoutArgs& d, cudaStream_t s) {
  bias_dropout_add_grad_kernel<T><<<blocks_for(n), kThreads, 0, s>>>(as<T>(dinp), as<T>(contrib), as<T>(dresidual),
                                                                    as<T>(dout), n, assign, d);
}

}  // namespace

void dgelu(DType dtype, void* dpre, const void* dout, const void* pre, int64_t n, bool erf, cudaStream_t stream) {
  if (n == 0) return;
  switch (dtype) {
    case DType::BF16: return dgelu_typed<__nv_bfloat16>(dpre, dout, pre, n, erf, stream);
    case DType::F16: return dgelu_typed<__half>(dpre, dout, pre, n, erf, stream);
    default: return dgelu_typed<float>(dpre, dout, pre, n, erf, stream);
  }
}

void bias_dropout_add_grad(DType dtype, void* dinp, void* contrib, void* dresidual, const void* dout, int64_t n,
                           bool assign, const DropoutArgs& dropout, cudaStream_t stream) {
  if (n == 0) return;
  switch (dtype) {
    case DType::BF16: return bda_typed<__nv_bfloat16>(dinp, contrib, dresidual, dout, n, assign, dropout, stream);
    case DType::F16: return bda_typed<__half>(dinp, contrib, dresidual, dout, n, assign, dropout, stream);
    default: return bda_typed<float>(dinp, contrib, dresidual, dout, n, assign, dropout, stream);
  }
}

}  // namespace tessera::ops::cuda::native
