// Sum of squares on CUDA (ops/kernels/sum_squares.cl): the GPU computes the CPU's 32
// double accumulators of every 65536-element chunk and adds them into the slot in the CPU's
// order (ops/cpu/reductions.cpp), so the result has the CPU's bits. No read-back.

#include "tessera/ops/cuda/cuda_launch.h"
#include "tessera/ops/cuda/cuda_ops.h"
#include "tessera/ops/kernels/float_args.h"

namespace tessera::ops::cuda {
namespace {

constexpr int64_t kChunk = 65536;  // SQ_CHUNK
constexpr int64_t kLanes = 32;     // SQ_LANES

}  // namespace

void sum_squares(Tensor sums, int64_t slot, Tensor t) {
  sums.check_dtype(DType::I64);
  TESSERA_CHECK(slot >= 0 && slot < sums.numel(),
                "sum_squares: slot " + std::to_string(slot) + " outside sums " + shape_str(sums.shape));
  const int64_t n = t.numel();
  if (n == 0) return;
  check_floating("sum_squares", {{"t", t}});
  const int64_t chunks = (n + kChunk - 1) / kChunk;
  const ScratchLease partial(*t.device, static_cast<size_t>(chunks * kLanes) * sizeof(double));
  CudaLaunch(t, "sum_squares_lanes").pointer(partial.data()).floats(t).scalar<int64_t>(n).run(kLanes, chunks);
  CudaLaunch(t, "sum_squares_add")
      .tensor(sums)
      .scalar<int64_t>(slot)
      .pointer(partial.data())
      .scalar<int64_t>(chunks)
      .run(1);
}

// ops/kernels/fp64.cl, as on OpenCL: the CPU's order of operations, into device memory.
void masked_loss_sums(Tensor sums, Tensor losses, Tensor mask) {
  sums.check_dtype(DType::I64);
  TESSERA_CHECK(sums.numel() == 2 && losses.numel() == mask.numel(),
                "masked_loss_sums: sums " + shape_str(sums.shape) + ", losses " + shape_str(losses.shape) +
                    ", mask " + shape_str(mask.shape));
  check_f32("masked_loss_sums", {{"losses", losses}, {"mask", mask}});
  CudaLaunch(losses, "masked_loss_sums").tensor(sums).tensor(losses).tensor(mask).scalar<int64_t>(losses.numel()).run(1);
}

void init_normal(Tensor out, float std, uint32_t seed, uint32_t tensor_id, ShardIndex where) {
  check_floating("init_normal", {{"out", out}});
  TESSERA_CHECK(where.cols > 0, "init_normal: ShardIndex.cols must be positive");
  CudaLaunch(out, "init_normal")
      .floats(out)
      .scalar<float>(std)
      .scalar<uint32_t>(seed)
      .scalar<uint32_t>(tensor_id)
      .scalar<int64_t>(where.first)
      .scalar<int64_t>(where.cols)
      .scalar<int64_t>(where.full_cols)
      .run(static_cast<size_t>(out.numel()));
}

}  // namespace tessera::ops::cuda
