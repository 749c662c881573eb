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

Shape multi_tensor_sum_squares_workspace(const Device&, int64_t chunks) { return {chunks * kLanes}; }

// ops/kernels/sum_squares.cl's multi-tensor kernels, as on OpenCL: into the caller's workspace.
void multi_tensor_sum_squares(Tensor sums, Tensor workspace, Tensor grad, Tensor chunks) {
  sums.check_dtype(DType::I64);
  workspace.check_dtype(DType::I64);
  check_f32("multi_tensor_sum_squares", {{"grad", grad}});
  chunks.check_dtype(DType::I64);
  TESSERA_CHECK(chunks.ndim() == 2 && chunks.dim(1) == kChunkColumns,
                "multi_tensor_sum_squares: chunks " + shape_str(chunks.shape) + ", expected [C, kChunkColumns]");
  const int64_t rows = chunks.dim(0);
  if (rows == 0) return;
  TESSERA_CHECK(workspace.numel() >= rows * kLanes, "multi_tensor_sum_squares: workspace " +
                                                        shape_str(workspace.shape) + " for " + std::to_string(rows) +
                                                        " chunks (see its workspace query)");
  CudaLaunch(grad, "multi_tensor_sum_squares_lanes").tensor(workspace).tensor(grad).tensor(chunks).run(kLanes, rows);
  CudaLaunch(grad, "multi_tensor_sum_squares_add").tensor(sums).tensor(workspace).tensor(chunks).run(rows);
}

void grad_norm_finish(Tensor result, Tensor scalars, Tensor sums, float clip_grad) {
  result.check_dtype(DType::I64);
  sums.check_dtype(DType::I64);
  check_f32("grad_norm_finish", {{"scalars", scalars}});
  TESSERA_CHECK(result.numel() == 2 && scalars.numel() == kStepScalars,
                "grad_norm_finish: result " + shape_str(result.shape) + ", scalars " + shape_str(scalars.shape));
  CudaLaunch(sums, "grad_norm_finish")
      .tensor(result)
      .tensor(scalars)
      .tensor(sums)
      .scalar<int64_t>(sums.numel())
      .scalar<float>(clip_grad)
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
