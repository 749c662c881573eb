// Native CUDA kernels of the multi-tensor optimizer step (multi_tensor_kernels.cu): typed
// over the 16-bit parameter copy, 128-bit loads where a chunk's offsets allow them, launched
// with <<<>>> on the given stream. optimizer_updates.cpp and sum_squares.cpp call them.
//
// - multi_tensor_adamw: ops.inc's multi_tensor_adamw, element for element the shared kernel's
//   arithmetic (optimizer.cl's adamw_element), compiled with --fmad=false like it, so the
//   update has the same bits on every backend (Exact) in every mode.
// - multi_tensor_sum_squares: the default mode's gradient norm partials: one block of 256
//   threads per chunk, each thread's squares in double, a fixed tree over the block, then each
//   segment's chunks added in order into its slot (OrderFree: a fixed order, so run-to-run
//   identical; --deterministic-mode keeps sum_squares.cl's 32 lanes, every backend's bits).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace tessera::ops::cuda::native {

// The dtype of the 16-bit parameter copy (or none).
enum class ParamType { None, BF16, F16 };

struct AdamwArgs {
  float* mains;
  void* params;  // null when ParamType::None
  ParamType param_type;
  const float* grad;
  float* m;
  float* v;
  const int64_t* chunks;  // [rows, kChunkColumns]
  int64_t rows;
  const float* scalars;  // [kStepScalars]
  float w1, w1c, beta2, w2, eps;
  int lerp_low;
  bool aligned;  // mains, grad, m and v start 16-byte aligned (then chunks with offsets of 4k use float4)
};
void multi_tensor_adamw(const AdamwArgs& a, cudaStream_t stream);

// partial: at least `rows` doubles of workspace; sums: doubles, one per slot.
void multi_tensor_sum_squares(double* sums, double* partial, const float* grad, const int64_t* chunks, int64_t rows,
                              cudaStream_t stream);

}  // namespace tessera::ops::cuda::native
