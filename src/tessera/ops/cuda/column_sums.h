// Column sums on CUDA in two deterministic passes (row_kernels.cuh: a fixed order of adds,
// no atomics, so the result never depends on timing): pass 1 sums blocks of
// kColumnBlockRows rows of every column into f32 partials, pass 2 adds each column's
// partials in block order. The bias gradients (linear_host.inc's column_sums) and the
// norms' parameter gradients (layernorm.cpp) run this way.
#pragma once

#include <cstdint>

#include "tessera/core/tensor.h"
#include "tessera/ops/op.h"

namespace tessera::ops::cuda {

// Rows per pass-1 block: N = 8192 rows of C = 768 columns give 128 x 768 work-items, each
// adding 64 rows (short chains: more of the GPU busy than with 128 or 256).
constexpr int64_t kColumnBlockRows = 64;

// The pass-1 blocks N rows take (the last may be shorter).
constexpr int64_t column_blocks(int64_t N) { return (N + kColumnBlockRows - 1) / kColumnBlockRows; }

// Pass 2: out[c] (+)= per `write` the partials of column c (f32 [blocks, C]) summed in block
// order, rounded once into out's dtype.
void add_column_partials(const Tensor& out, const float* partials, int64_t C, int64_t blocks,
                         GradWrite write = GradWrite::Accumulate);

// dbias[c] (+)= per `write` the sum over rows of dout[r, c] (dout: [rows, OC]; no rows:
// zeros when assigning); linear_host.inc's column_sums on CUDA.
void column_sums(const Tensor& dbias, const Tensor& dout, GradWrite write);
// The same with pass 1's partials in the caller's scratch (column_partials_bytes of it), for
// a caller that already holds the device's scratch.
size_t column_partials_bytes(int64_t N, int64_t C);
void column_sums(const Tensor& dbias, const Tensor& dout, void* partials, GradWrite write);

}  // namespace tessera::ops::cuda
