// Native CUDA kernels of SwiGLU (swiglu_kernels.cu): typed over the tensors' one storage
// dtype, 128-bit loads and stores where the rows allow them, the per-element arithmetic of
// element_math.h (expf, contracted freely: the op is OrderFree). elementwise.cpp calls them
// in the default mode where the tensors share a dtype; --deterministic-mode and mixed
// dtypes run the shared elementwise.cl kernels (their exp_approx, their bits).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "tessera/core/dtype.h"

namespace tessera::ops::cuda::native {

// out[n, f] = silu(inp[n, f]) * inp[n, F + f] over N rows; out [N, F], inp [N, 2F].
void swiglu_forward(DType dtype, void* out, const void* inp, int64_t N, int64_t F, cudaStream_t stream);

// dinp[n, f] (+)= dgate, dinp[n, F + f] (+)= dup (assign: =), rounded once each.
void swiglu_backward(DType dtype, void* dinp, const void* dout, const void* inp, int64_t N, int64_t F, bool assign,
                     cudaStream_t stream);

}  // namespace tessera::ops::cuda::native
