// Sum of squares on OpenCL (kernels/sum_squares.cl): the device computes the CPU's 32
// double accumulators of every 65536-element chunk, the host adds them in the CPU's order
// (ops/cpu/reductions.cpp), so the result has the CPU's bits. One read-back per call.
// Devices without cl_khr_fp64 fall back to the CPU backend on a host copy.
#include <vector>

#include "tessera/ops/opencl/cl_launch.h"
#include "tessera/ops/opencl/opencl_ops.h"

namespace tessera::ops::opencl {
namespace {

constexpr int64_t kChunk = 65536;  // SQ_CHUNK
constexpr int64_t kLanes = 32;     // SQ_LANES

}  // namespace

double sum_squares(Tensor t) {
  const int64_t n = t.numel();
  if (n == 0) return 0.0;
  t.check_dtype(DType::F32);
  ClContext& cl = context_of(t);
  if (!cl.info().fp64) {
    // No doubles on this device (cl_khr_fp64): the CPU backend sums a host copy, which
    // costs a read-back of the whole tensor but gives the same bits.
    std::vector<float> host(static_cast<size_t>(n));
    cl.read(host.data(), cl_buffer(t), t.offset, t.bytes());
    return ops::sum_squares(Tensor(host.data(), DType::F32, {n}, &cpu_device()));
  }
  const int64_t chunks = (n + kChunk - 1) / kChunk;
  const ClScratch partial(cl, static_cast<size_t>(chunks * kLanes) * sizeof(double));
  ClLaunch::fp64(cl, "sum_squares_lanes").buffer(partial.mem()).tensor(t).scalar<int64_t>(n).run(kLanes, chunks);
  std::vector<double> lanes(static_cast<size_t>(chunks * kLanes));
  cl.read(lanes.data(), partial.mem(), 0, lanes.size() * sizeof(double));
  double total = 0.0;
  for (int64_t c = 0; c < chunks; ++c) {
    double s = 0.0;
    for (int64_t j = 0; j < kLanes; ++j) s += lanes[static_cast<size_t>(c * kLanes + j)];
    total += s;
  }
  return total;
}

}  // namespace tessera::ops::opencl
