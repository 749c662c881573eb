// The host side of column_sums.h.
#include "tessera/ops/cuda/column_sums.h"

#include "tessera/ops/cuda/cuda_launch.h"

namespace tessera::ops::cuda {

void add_column_partials(const Tensor& out, const float* partials, int64_t C, int64_t blocks, GradWrite write) {
  CudaLaunch(out, "column_partials_add")
      .floats(out)
      .pointer(partials)
      .scalar<int64_t>(C)
      .scalar<int64_t>(blocks)
      .scalar<int32_t>(write == GradWrite::Assign)
      .run(C);
}

size_t column_partials_bytes(int64_t N, int64_t C) { return static_cast<size_t>(column_blocks(N) * C) * sizeof(float); }

void column_sums(const Tensor& dbias, const Tensor& dout, GradWrite write) {
  const int64_t OC = dbias.numel(), N = dout.numel() / OC;
  if (column_blocks(N) == 0) return column_sums(dbias, dout, nullptr, write);
  const Pieces partials(*dout.device, {column_partials_bytes(N, OC)});
  column_sums(dbias, dout, partials[0], write);
}

void column_sums(const Tensor& dbias, const Tensor& dout, void* partials, GradWrite write) {
  const int64_t OC = dbias.numel(), N = dout.numel() / OC, blocks = column_blocks(N);
  if (blocks == 0) {  // no rows: nothing to add (as the shared kernel adds 0), zeros to assign
    if (write == GradWrite::Assign) fill_zero(dbias);
    return;
  }
  CudaLaunch(dout, "column_sums_partials")
      .pointer(partials)
      .floats(dout)
      .scalar<int64_t>(N)
      .scalar<int64_t>(OC)
      .scalar<int64_t>(kColumnBlockRows)
      .run(OC, blocks);
  add_column_partials(dbias, static_cast<const float*>(partials), OC, blocks, write);
}

}  // namespace tessera::ops::cuda
