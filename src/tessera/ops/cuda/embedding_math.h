// The work items of CUDA's native embedding backward (embedding_kernels.cu), as C++ that nvcc
// (device code) and the host compiler both read, so the CPU tests run them against
// ops/cpu/embedding.cpp bit for bit (tests/unit/ops/cuda_element_math_test.cpp).
//
// The CPU's algorithm on a GPU, without float atomics (PyTorch's embedding_dense_backward_cuda
// sorts too, aten/src/ATen/native/cuda/EmbeddingBackwardKernel.cu): each row n of dout gets
// the key of the table row it adds into (embedding_key: `rows`, past every row, when it adds
// nothing); a stable radix sort of (key, n) puts each table row's rows in one run, in row
// order; then item (i, c) with i the first sorted index of a run adds the run's rows of
// channel c onto the table's value in that order and stores once (run_sum_item). So every
// element sums its rows in order n = 0, 1, ... and is rounded once, the CPU's bits: the op is
// Exact, and the same kernels serve --deterministic-mode.
#pragma once

#include <stdint.h>

#include "tessera/ops/cuda/host_device.h"

namespace tessera::ops::cuda::native {

// The sort key of an id for a table of `rows` rows holding ids [start, start + rows).
TESSERA_HD uint32_t embedding_key(int32_t id, int64_t start, int64_t rows) {
  const int64_t k = static_cast<int64_t>(id) - start;
  return k >= 0 && k < rows ? static_cast<uint32_t>(k) : static_cast<uint32_t>(rows);
}

// The bits a radix sort needs for keys up to `rows` (the sentinel included).
TESSERA_HD int embedding_key_bits(int64_t rows) {
  int bits = 1;
  while ((int64_t{1} << bits) <= rows) ++bits;
  return bits;
}

// Item (i, c): when sorted index i starts a run of a table row, table[key, c] = its value plus
// dout[n, c] for the run's rows n in order (keys, rows: the sorted pairs, N of them).
// load_table / store_table reach element (row * C + c) of the table, load_dout of dout.
template <class LoadTable, class StoreTable, class LoadDout>
TESSERA_HD void run_sum_item(const uint32_t* keys, const int32_t* rows, int64_t N, int64_t table_rows, int64_t C,
                             int64_t i, int64_t c, const LoadTable& load_table, const StoreTable& store_table,
                             const LoadDout& load_dout) {
  const uint32_t key = keys[i];
  if (key >= table_rows || (i > 0 && keys[i - 1] == key)) return;
  float acc = load_table(key * C + c);
  for (int64_t j = i; j < N && keys[j] == key; ++j) acc += load_dout(static_cast<int64_t>(rows[j]) * C + c);
  store_table(key * C + c, acc);
}

}  // namespace tessera::ops::cuda::native
