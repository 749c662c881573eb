// Native CUDA kernels of attention_qkv (rope_kernels.cu): the grouped QKV layout to the
// per-head one with RoPE on q and k, and the backward, typed over the tensors' one storage
// dtype, one thread per item of rope_math.h (a rotated pair or two plain channels of one
// slot of a row). attention.cpp calls them in the default mode where the tensors share a
// dtype; --deterministic-mode and mixed dtypes run the shared attention.cl kernels (their f32
// pow, cos and sin, their bits).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "tessera/core/dtype.h"
#include "tessera/ops/cuda/rope_math.h"

namespace tessera::ops::cuda::native {

// out [B*T, per_head_row] = qkv [B*T, grouped_row] regrouped, q and k rotated.
void attention_qkv_forward(DType dtype, void* out, const void* qkv, int64_t rows, const QkvShape& shape,
                           const RopeFreqs& freqs, cudaStream_t stream);

// dqkv += the transpose from dout.
void attention_qkv_backward(DType dtype, void* dqkv, const void* dout, int64_t rows, const QkvShape& shape,
                            const RopeFreqs& freqs, cudaStream_t stream);

}  // namespace tessera::ops::cuda::native
