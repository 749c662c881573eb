// Sum of squares on CUDA (ops/kernels/sum_squares.cl): the GPU computes the CPU's 32
// double accumulators of every 65536-element chunk, the host adds them in the CPU's order
// (ops/cpu/reductions.cpp), so the result has the CPU's bits. One read-back per call.
#include <vector>

#include "tessera/ops/cuda/cuda_launch.h"
#include "tessera/ops/cuda/cuda_ops.h"

namespace tessera::ops::cuda {
namespace {

constexpr int64_t kChunk = 65536;  // SQ_CHUNK
constexpr int64_t kLanes = 32;     // SQ_LANES

}  // namespace

double sum_squares(Tensor t) {
  const int64_t n = t.numel();
  if (n == 0) return 0.0;
  t.check_dtype(DType::F32);
  const int64_t chunks = (n + kChunk - 1) / kChunk;
  std::vector<double> lanes(static_cast<size_t>(chunks * kLanes));
  {
    const ScratchLease partial(*t.device, lanes.size() * sizeof(double));
    CudaLaunch(t, "sum_squares_lanes").pointer(partial.data()).tensor(t).scalar<int64_t>(n).run(kLanes, chunks);
    t.device->copy_to_host(lanes.data(), partial.data(), 0, lanes.size() * sizeof(double));
  }
  double total = 0.0;
  for (int64_t c = 0; c < chunks; ++c) {
    double s = 0.0;
    for (int64_t j = 0; j < kLanes; ++j) s += lanes[static_cast<size_t>(c * kLanes + j)];
    total += s;
  }
  return total;
}

}  // namespace tessera::ops::cuda
