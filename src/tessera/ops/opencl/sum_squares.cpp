// The reductions and initialisation that need doubles (kernels/sum_squares.cl, fp64.cl):
// each reproduces its CPU kernel's order of operations, so the results have the CPU's bits,
// and each writes device memory (no read-back). Devices without cl_khr_fp64 run the CPU
// kernel on host copies instead, which costs the transfers (and host allocations) but
// gives the same bits.
#include <vector>

#include "tessera/ops/opencl/cl_launch.h"
#include "tessera/ops/kernels/float_args.h"
#include "tessera/ops/opencl/opencl_ops.h"

namespace tessera::ops::opencl {
namespace {

constexpr int64_t kChunk = 65536;  // SQ_CHUNK
constexpr int64_t kLanes = 32;     // SQ_LANES

// A host copy of t, as a tensor of the CPU device.
struct HostCopy {
  std::vector<char> bytes;
  Tensor tensor;
  explicit HostCopy(const Tensor& t) : bytes(t.bytes()) {
    if (!t.empty()) context_of(t).read(bytes.data(), cl_buffer(t), t.offset, t.bytes());
    tensor = Tensor(bytes.data(), t.dtype, t.shape, &cpu_device());
  }
  void write_back(const Tensor& t) const { context_of(t).write(cl_buffer(t), t.offset, bytes.data(), t.bytes()); }
};

void check_sums(const Tensor& sums, int64_t count, const char* op) {
  sums.check_dtype(DType::I64);
  TESSERA_CHECK(sums.numel() >= count, std::string(op) + ": sums " + shape_str(sums.shape) + " too small");
}

}  // namespace

void sum_squares(Tensor sums, int64_t slot, Tensor t) {
  check_sums(sums, slot + 1, "sum_squares");
  TESSERA_CHECK(slot >= 0, "sum_squares: negative slot");
  check_floating("sum_squares", {{"t", t}});
  const int64_t n = t.numel();
  if (n == 0) return;
  ClContext& cl = context_of(t);
  if (!cl.info().fp64) {
    HostCopy host_sums(sums), host_t(t);
    ops::sum_squares(host_sums.tensor, slot, host_t.tensor);
    host_sums.write_back(sums);
    return;
  }
  const int64_t chunks = (n + kChunk - 1) / kChunk;
  const ClScratch partial(cl, static_cast<size_t>(chunks * kLanes) * sizeof(double));
  ClLaunch::fp64(cl, "sum_squares_lanes").buffer(partial.mem()).floats(t).scalar<int64_t>(n).run(kLanes, chunks);
  ClLaunch::fp64(cl, "sum_squares_add").tensor(sums).scalar<int64_t>(slot).buffer(partial.mem()).scalar<int64_t>(chunks).run(1);
}

Shape multi_tensor_sum_squares_workspace(const Device&, int64_t chunks) { return {chunks * kLanes}; }

void multi_tensor_sum_squares(Tensor sums, Tensor workspace, Tensor grad, Tensor chunks) {
  sums.check_dtype(DType::I64);
  check_f32("multi_tensor_sum_squares", {{"grad", grad}});
  chunks.check_dtype(DType::I64);
  TESSERA_CHECK(chunks.ndim() == 2 && chunks.dim(1) == kChunkColumns,
                "multi_tensor_sum_squares: chunks " + shape_str(chunks.shape) + ", expected [C, kChunkColumns]");
  const int64_t rows = chunks.dim(0);
  if (rows == 0) return;
  ClContext& cl = context_of(grad);
  if (!cl.info().fp64) {
    HostCopy host_sums(sums), host_ws(workspace), host_grad(grad), host_chunks(chunks);
    ops::multi_tensor_sum_squares(host_sums.tensor, host_ws.tensor, host_grad.tensor, host_chunks.tensor);
    host_sums.write_back(sums);
    return;
  }
  workspace.check_dtype(DType::I64);
  TESSERA_CHECK(workspace.numel() >= rows * kLanes, "multi_tensor_sum_squares: workspace " +
                                                        shape_str(workspace.shape) + " for " + std::to_string(rows) +
                                                        " chunks (see its workspace query)");
  ClLaunch::fp64(cl, "multi_tensor_sum_squares_lanes").tensor(workspace).tensor(grad).tensor(chunks).run(kLanes, rows);
  ClLaunch::fp64(cl, "multi_tensor_sum_squares_add").tensor(sums).tensor(workspace).tensor(chunks).run(rows);
}

void grad_norm_finish(Tensor result, Tensor scalars, Tensor sums, float clip_grad) {
  check_sums(result, 2, "grad_norm_finish");
  sums.check_dtype(DType::I64);
  check_f32("grad_norm_finish", {{"scalars", scalars}});
  TESSERA_CHECK(scalars.numel() == kStepScalars, "grad_norm_finish: scalars " + shape_str(scalars.shape));
  ClContext& cl = context_of(sums);
  if (!cl.info().fp64) {
    HostCopy host_result(result), host_scalars(scalars), host_sums(sums);
    ops::grad_norm_finish(host_result.tensor, host_scalars.tensor, host_sums.tensor, clip_grad);
    host_result.write_back(result);
    host_scalars.write_back(scalars);
    return;
  }
  ClLaunch::fp64(cl, "grad_norm_finish")
      .tensor(result)
      .tensor(scalars)
      .tensor(sums)
      .scalar<int64_t>(sums.numel())
      .scalar<float>(clip_grad)
      .run(1);
}

void masked_loss_sums(Tensor sums, Tensor losses, Tensor mask) {
  check_sums(sums, 2, "masked_loss_sums");
  TESSERA_CHECK(losses.numel() == mask.numel(), "masked_loss_sums: losses " + shape_str(losses.shape) + ", mask " +
                                                    shape_str(mask.shape));
  check_f32("masked_loss_sums", {{"losses", losses}, {"mask", mask}});
  ClContext& cl = context_of(losses);
  if (!cl.info().fp64) {
    HostCopy host_sums(sums), host_losses(losses), host_mask(mask);
    ops::masked_loss_sums(host_sums.tensor, host_losses.tensor, host_mask.tensor);
    host_sums.write_back(sums);
    return;
  }
  ClLaunch::fp64(cl, "masked_loss_sums").tensor(sums).tensor(losses).tensor(mask).scalar<int64_t>(losses.numel()).run(1);
}

void init_normal(Tensor out, float std, uint32_t seed, uint32_t tensor_id, ShardIndex where) {
  check_floating("init_normal", {{"out", out}});
  TESSERA_CHECK(where.cols > 0, "init_normal: ShardIndex.cols must be positive");
  ClContext& cl = context_of(out);
  if (!cl.info().fp64) {
    HostCopy host(out);
    ops::init_normal(host.tensor, std, seed, tensor_id, where);
    host.write_back(out);
    return;
  }
  ClLaunch::fp64(cl, "init_normal")
      .floats(out)
      .scalar<float>(std)
      .scalar<uint32_t>(seed)
      .scalar<uint32_t>(tensor_id)
      .scalar<int64_t>(where.first)
      .scalar<int64_t>(where.cols)
      .scalar<int64_t>(where.full_cols)
      .run(static_cast<size_t>(out.numel()));
}

}  // namespace tessera::ops::opencl
