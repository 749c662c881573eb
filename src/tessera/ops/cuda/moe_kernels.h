// Native CUDA kernels of the mixture of experts' row movement (moe_kernels.cu): ops.inc's
// moe_permute_* and moe_unpermute_*, typed over the tensors' one storage dtype, a block of
// threads per row with 128-bit loads and stores where the rows allow them. The sums run in
// route order from the CPU's start (ops/cpu/moe.cpp), so the Exact permutes give its bits;
// the unpermute's products may fuse (OrderFree) and its weight gradient is a block's tree
// sum. moe.cpp calls them where the tensors share a dtype, else the shared moe.cl kernels.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "tessera/core/dtype.h"

namespace tessera::ops::cuda::native {

// The rows and maps of one call (ops.inc: slots [N,k], sources [M]; -1 none).
struct MoeRows {
  DType dtype;
  int64_t N, M, C, k;
  const int32_t* slots;
  const int32_t* sources;
};

// out [M,C] = inp [N,C] rows by sources (zeros for padding rows).
void moe_permute_forward(const MoeRows& r, void* out, const void* inp, cudaStream_t stream);
// dinp [N,C] (+)= the sum over routes in order of dout [M,C] rows by slots.
void moe_permute_backward(const MoeRows& r, void* dinp, const void* dout, bool assign, cudaStream_t stream);
// out [N,C] = the weighted sum over routes in order of inp [M,C] rows by slots.
void moe_unpermute_forward(const MoeRows& r, void* out, const void* inp, const float* weights, cudaStream_t stream);
// dinp [M,C] = weights[route] * dout [N,C] row (zeros for padding rows); dweights [N,k] = the
// dot of that dout row and inp's row for each row's route (the caller zeroes dweights first,
// so a dropped route keeps 0).
void moe_unpermute_backward(const MoeRows& r, void* dinp, float* dweights, const void* dout, const void* inp,
                            const float* weights, cudaStream_t stream);

}  // namespace tessera::ops::cuda::native
