#include "tessera/ops/cuda/rope_kernels.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "tessera/ops/cuda/typed_access.cuh"

namespace tessera::ops::cuda::native {
namespace {

constexpr int kThreads = 256;

// Block (row, y), thread x: item y * kThreads + x of the row's NG * (R + 2) * pairs, slot by slot.
template <typename T, bool Forward>
__global__ void attention_qkv_kernel(T* dst, const T* src, QkvShape s, RopeFreqs freqs) {
  const int64_t items = s.NG * (s.R + 2) * s.pairs();
  const int64_t item = static_cast<int64_t>(blockIdx.y) * kThreads + threadIdx.x, row = blockIdx.x;
  if (item >= items) return;
  const int64_t j = item % s.pairs(), slot = item / s.pairs() % (s.R + 2), g = item / s.pairs() / (s.R + 2);
  if constexpr (Forward)
    qkv_forward_item(s, freqs.inv_freq, row, g, slot, j, ElementReader<T>{src}, ElementWriter<T>{dst});
  else
    qkv_backward_item(s, freqs.inv_freq, row, g, slot, j, ElementReader<T>{src}, ElementReader<T>{dst},
                      ElementWriter<T>{dst});
}

template <bool Forward>
void launch(DType dtype, void* dst, const void* src, int64_t rows, const QkvShape& s, const RopeFreqs& freqs,
            cudaStream_t stream) {
  if (rows == 0) return;
  const int64_t items = s.NG * (s.R + 2) * s.pairs();
  const dim3 grid(static_cast<unsigned>(rows), static_cast<unsigned>((items + kThreads - 1) / kThreads));
  switch (dtype) {
    case DType::BF16:
      return attention_qkv_kernel<__nv_bfloat16, Forward><<<grid, kThreads, 0, stream>>>(
          static_cast<__nv_bfloat16*>(dst), static_cast<const __nv_bfloat16*>(src), s, freqs);
    case DType::F16:
      return attention_qkv_kernel<__half, Forward>
          <<<grid, kThreads, 0, stream>>>(static_cast<__half*>(dst), static_cast<const __half*>(src), s, freqs);
    default:
      return attention_qkv_kernel<float, Forward>
          <<<grid, kThreads, 0, stream>>>(static_cast<float*>(dst), static_cast<const float*>(src), s, freqs);
  }
}

}  // namespace

void attention_qkv_forward(DType dtype, void* out, const void* qkv, int64_t rows, const QkvShape& shape,
                           const RopeFreqs& freqs, cudaStream_t stream) {
  launch<true>(dtype, out, qkv, rows, shape, freqs, stream);
}

void attention_qkv_backward(DType dtype, void* dqkv, const void* dout, int64_t rows, const QkvShape& shape,
                            const RopeFreqs& freqs, cudaStream_t stream) {
  launch<false>(dtype, dqkv, dout, rows, shape, freqs, stream);
}

}  // namespace tessera::ops::cuda::native
