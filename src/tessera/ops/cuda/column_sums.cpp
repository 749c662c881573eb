// The host side of column_sums.h.
#include "tessera/ops/cuda/column_sums.h"

#include "tessera/ops/cuda/cuda_launch.h"

namespace tessera::ops::cuda {

void add_column_partials(const Tensor& out, const float* partials, int64_t C, int64_t blocks) {
  CudaLaunch(out, "column_partials_add")
      .floats(out)
      .pointer(partials)
      .scalar<int64_t>(C)
      .scalar<int64_t>(blocks)
      .run(C);
}

size_t column_partials_bytes(int64_t N, int64_t C) { return static_cast<size_t>(column_blocks(N) * C) * sizeof(float); }

void column_sums(const Tensor& dbias, const Tensor& dout) {
  const int64_t OC = dbias.numel(), N = dout.numel() / OC;
  if (column_blocks(N) == 0) return;  // no rows: nothing to add (as the shared kernel adds 0)
  const Pieces partials(*dout.device, {column_partials_bytes(N, OC)});
  column_sums(dbias, dout, partials[0]);
}

void column_sums(const Tensor& dbias, const Tensor& dout, void* partials) {
  const int64_t OC = dbias.numel(), N = dout.numel() / OC, blocks = column_blocks(N);
  if (blocks == 0) return;
  CudaLaunch(dout, "column_sums_partials")
      .pointer(partials)
      .floats(dout)
      .scalar<int64_t>(N)
      .scalar<int64_t>(OC)
      .scalar<int64_t>(kColumnBlockRows)
      .run(OC, blocks);
  add_column_partials(dbias, static_cast<const float*>(partials), OC, blocks);
}

}  // namespace tessera::ops::cuda
