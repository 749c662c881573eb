// Native CUDA kernels of LayerNorm and RMSNorm, the forward and the input gradient
// (norm_kernels.cu): typed over the tensors' one storage dtype, a row per thread block
// sized to the row (128-bit loads and stores where the rows allow them), f32 arithmetic
// contracted freely (the ops are OrderFree). The forward stages its row in shared memory,
// so it reads the input once. layernorm.cpp calls them in the default mode where the
// tensors share a dtype and the row fits (norm_serves); --deterministic-mode keeps the
// row kernels of row_kernels.cuh (their order, their bits). The parameter gradients are
// column_sums.h's two-pass sums in every mode.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "tessera/core/dtype.h"

namespace tessera::ops::cuda::native {

// Whether the native kernels take rows of C elements of dtype (the forward's staged row
// fits the default 48 KiB of shared memory).
bool norm_serves(int64_t C);

// One norm call over N rows of C: LayerNorm (bias may be null) or, with rms, RMSNorm (mean
// and bias unused). mean and rstd are f32 [N], either may be null in the forward.
struct NormArgs {
  DType dtype;
  bool rms;
  int64_t N, C;
  const void* inp;
  const void* weight;
  const void* bias;
  float* mean;
  float* rstd;
};

// out = (inp - mean) * rstd * weight (+ bias), saving mean and rstd when given.
void norm_forward(const NormArgs& a, void* out, float eps, cudaStream_t stream);

// dinp (+)= rstd * (g - mean(g) - xhat * mean(g * xhat)), g = dout * weight (RMSNorm
// without the mean(g) term), from the saved mean and rstd.
void norm_backward_input(const NormArgs& a, void* dinp, const void* dout, bool assign, cudaStream_t stream);

}  // namespace tessera::ops::cuda::native
