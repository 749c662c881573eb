// Native CUDA kernels of the embedding backward (embedding_kernels.cu): embedding_math.h's
// sort-and-run algorithm (a stable CUB radix sort of the rows by table row, then one pass adding
// each run in row order), typed over the table's and dout's storage dtypes. Exact: the CPU's
// bits, in every mode (embedding.cpp runs it in --deterministic-mode too).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "tessera/core/dtype.h"

namespace tessera::ops::cuda::native {

// One table's gradient: table[ids[n] - start] += dout[n] for the ids in [start, start + rows).
struct EmbeddingTableGrad {
  DType dtype;
  void* table;  // [rows, C]
  int64_t rows;
  const int32_t* ids;  // [N]
  int64_t start;
};

// The scratch embedding_table_backward needs for N rows (its sort's keys, rows and CUB's
// temporary storage); the caller owns it.
size_t embedding_backward_scratch_bytes(int64_t N);

void embedding_table_backward(const EmbeddingTableGrad& grad, DType dout_dtype, const void* dout, int64_t N, int64_t C,
                              void* scratch, cudaStream_t stream);

}  // namespace tessera::ops::cuda::native
