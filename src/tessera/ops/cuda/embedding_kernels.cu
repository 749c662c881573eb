#include "tessera/ops/cuda/embedding_kernels.h"

#include <cub/device/device_radix_sort.cuh>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "tessera/ops/cuda/embedding_math.h"
#include "tessera/ops/cuda/typed_access.cuh"

namespace tessera::ops::cuda::native {
namespace {

constexpr int kThreads = 128;

size_t aligned(size_t bytes) { return (bytes + 255) / 256 * 256; }

// The sort's four arrays of N, then CUB's storage.
struct SortScratch {
  uint32_t *keys, *sorted_keys;
  int32_t *rows, *sorted_rows;
  void* cub;
  size_t cub_bytes;
};

size_t cub_bytes(int64_t N) {
  size_t bytes = 0;
  cub::DeviceRadixSort::SortPairs(nullptr, bytes, static_cast<const uint32_t*>(nullptr),
                                  static_cast<uint32_t*>(nullptr), static_cast<const int32_t*>(nullptr),
                                  static_cast<int32_t*>(nullptr), static_cast<int>(N));
  return bytes;
}

SortScratch carve(void* scratch, int64_t N) {
  char* p = static_cast<char*>(scratch);
  const size_t a = aligned(static_cast<size_t>(N) * 4);
  return {reinterpret_cast<uint32_t*>(p), reinterpret_cast<uint32_t*>(p + a), reinterpret_cast<int32_t*>(p + 2 * a),
          reinterpret_cast<int32_t*>(p + 3 * a), p + 4 * a, cub_bytes(N)};
}

__global__ void embedding_keys_kernel(uint32_t* keys, int32_t* rows, const int32_t* ids, int64_t N, int64_t start,
                                      int64_t table_rows) {
  const int64_t n = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  if (n >= N) return;
  keys[n] = embedding_key(ids[n], start, table_rows);
  rows[n] = static_cast<int32_t>(n);
}

// Block (sorted index i, channel block y), thread x: channel y * kThreads + x.
template <typename Table, typename Dout>
__global__ void embedding_runs_kernel(Table* table, const Dout* dout, const uint32_t* keys, const int32_t* rows,
                                      int64_t N, int64_t table_rows, int64_t C) {
  const int64_t i = blockIdx.x, c = static_cast<int64_t>(blockIdx.y) * kThreads + threadIdx.x;
  if (c >= C) return;
  run_sum_item(keys, rows, N, table_rows, C, i, c, ElementReader<Table>{table}, ElementWriter<Table>{table},
               ElementReader<Dout>{dout});
}

template <typename Table, typename Dout>
void add_runs(void* table, const void* dout, const SortScratch& s, int64_t N, int64_t table_rows, int64_t C,
              cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>(N), static_cast<unsigned>((C + kThreads - 1) / kThreads));
  embedding_runs_kernel<Table, Dout><<<grid, kThreads, 0, stream>>>(
      static_cast<Table*>(table), static_cast<const Dout*>(dout), s.sorted_keys, s.sorted_rows, N, table_rows, C);
}

template <typename Table>
void add_runs_for(DType dout_dtype, void* table, const void* dout, const SortScratch& s, int64_t N, int64_t rows,
                  int64_t C, cudaStream_t stream) {
  switch (dout_dtype) {
    case DType::BF16: return add_runs<Table, __nv_bfloat16>(table, dout, s, N, rows, C, stream);
    case DType::F16: return add_runs<Table, __half>(table, dout, s, N, rows, C, stream);
    default: return add_runs<Table, float>(table, dout, s, N, rows, C, stream);
  }
}

}  // namespace

size_t embedding_backward_scratch_bytes(int64_t N) { return 4 * aligned(static_cast<size_t>(N) * 4) + cub_bytes(N); }

void embedding_table_backward(const EmbeddingTableGrad& g, DType dout_dtype, const void* dout, int64_t N, int64_t C,
                              void* scratch, cudaStream_t stream) {
  if (N == 0 || g.rows == 0) return;
  SortScratch s = carve(scratch, N);
  embedding_keys_kernel<<<static_cast<unsigned>((N + kThreads - 1) / kThreads), kThreads, 0, stream>>>(
      s.keys, s.rows, g.ids, N, g.start, g.rows);
  cub::DeviceRadixSort::SortPairs(s.cub, s.cub_bytes, s.keys, s.sorted_keys, s.rows, s.sorted_rows, static_cast<int>(N),
                                  0, embedding_key_bits(g.rows), stream);
  switch (g.dtype) {
    case DType::BF16: return add_runs_for<__nv_bfloat16>(dout_dtype, g.table, dout, s, N, g.rows, C, stream);
    case DType::F16: return add_runs_for<__half>(dout_dtype, g.table, dout, s, N, g.rows, C, stream);
    default: return add_runs_for<float>(dout_dtype, g.table, dout, s, N, g.rows, C, stream);
  }
}

}  // namespace tessera::ops::cuda::native
