// Native CUDA kernels of the fused epilogues' backward passes (epilogue_kernels.cu), the
// element-wise halves: typed over the activations' one storage dtype, every thread busy
// (the shared kernels walk one column per work-item over every row). The bias gradients
// are then the fixed-order two-pass column sums of column_sums.h. epilogue.cpp calls them
// where the tensors share a dtype (else the shared kernels run).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "tessera/core/dtype.h"
#include "tessera/ops/cuda/element_math.h"

namespace tessera::ops::cuda::native {

// dpre[i] = dout[i] * gelu'(pre[i]) (tanh form, or erf), rounded once; dpre may be dout.
void dgelu(DType dtype, void* dpre, const void* dout, const void* pre, int64_t n, bool erf, cudaStream_t stream);

// c[i] = dout[i] * dropout_factor(i) (element_math.h), rounded to the dtype; dinp (+)= c (assign: =), contrib = c
// when given (the bias gradient's column sums read it), dresidual (+)= dout. Each of dinp,
// contrib, dresidual may be null; dinp and contrib may not be the same.
void bias_dropout_add_grad(DType dtype, void* dinp, void* contrib, void* dresidual, const void* dout, int64_t n,
                           bool assign, const DropoutArgs& dropout, cudaStream_t stream);

}  // namespace tessera::ops::cuda::native
