// Linear layer on OpenCL: the GEMMs through CLBlast (CLBlastSgemm on row-major buffers
// with element offsets), the bias and its gradient through kernels/elementwise.cl. Shapes
// and the dtype contract as ops/cpu/linear.cpp:
//   forward:  out[N,OC]  = inp[N,C] @ W[OC,C]^T + bias[OC]
//   backward: dinp[N,C] += dout @ W (= when assigning: beta 0);  dW[OC,C] += dout^T @ inp;
//             dbias[OC] += column sums
// All-F32 calls multiply the tensors' own buffers.
//
// 16-bit tensors (ops.h: any of inp, weight, bias, out, dinp, dout, dweight, dbias may be
// BF16 or F16): each 16-bit GEMM operand is widened exactly into f32 scratch and
// CLBlast's sgemm multiplies (a product of two 16-bit values is exact in f32, so this is a
// 16-bit GEMM with f32 accumulation), and each result is rounded once: the forward's GEMM
// lands in f32 scratch, then out = round(y + bias); a 16-bit gradient is widened into f32
// scratch, accumulates every product there, and is rounded back once. The weight's rows
// (OC) go in tiles so that the scratch stays bounded for an LM head.
#include <algorithm>
#include <optional>

#include "tessera/ops/kernels/float_args.h"
#include "tessera/ops/linear_shapes.h"
#include "tessera/ops/opencl/cl_launch.h"
#include "tessera/ops/opencl/opencl_ops.h"

#include <clblast_c.h>

#define TESSERA_BACKEND opencl
#include "tessera/ops/kernels/linear_host.inc"
#undef TESSERA_BACKEND

namespace tessera::ops::opencl {
namespace {

// A row-major GEMM operand: buffer, offset in elements, leading dimension.
struct Operand {
  cl_mem mem;
  uint64_t offset;
  int64_t ld;
};
Operand operand(const Tensor& t, int64_t ld) { return {cl_buffer(t), cl_offset(t), ld}; }

// C[M,N] = op(A) @ op(B) + beta * C.
void sgemm(ClContext& cl, bool ta, bool tb, int64_t M, int64_t N, int64_t K, Operand A, Operand B, float beta,
           Operand C) {
  if (M == 0 || N == 0) return;
  cl_command_queue queue = cl.queue();
  const CLBlastStatusCode status =
      CLBlastSgemm(CLBlastLayoutRowMajor, ta ? CLBlastTransposeYes : CLBlastTransposeNo,
                   tb ? CLBlastTransposeYes : CLBlastTransposeNo, M, N, K, 1.0f, A.mem, A.offset, A.ld, B.mem,
                   B.offset, B.ld, beta, C.mem, C.offset, C.ld, &queue, nullptr);
  if (status != CLBlastSuccess)
    throw runtime_error("CLBlastSgemm (" + std::to_string(M) + "x" + std::to_string(N) + "x" + std::to_string(K) +
                            ") failed with status " + std::to_string(static_cast<int>(status)) + " (" +
                            tessera::opencl::cl_error_name(static_cast<cl_int>(status)) + " for codes above -1000; " +
                            "see clblast_c.h) on " + cl.where(),
                        "CLBlast could not run its GEMM kernel on this device; `tessera doctor --device opencl` "
                        "runs one");
}

Operand scratch_operand(const ClScratch& s, int64_t ld) { return {s.mem(), 0, ld}; }

// The view of t from element `first` on (its shape only names the block).
Tensor from(const Tensor& t, int64_t first, Shape shape) {
  return Tensor(t.handle, t.offset + static_cast<size_t>(first) * dtype_size(t.dtype), t.dtype, std::move(shape),
                t.device);
}

// Weight rows per tile of the 16-bit path: each converted block (W's rows, dout's columns,
// the forward's result) holds at most about 4M f32 (16 MB), at least 64 rows.
int64_t tile_rows(int64_t N, int64_t C) {
  return std::max<int64_t>(64, (int64_t{1} << 22) / std::max<int64_t>({N, C, 1}));
}

// An f32 block for the GEMMs: the rows x cols block of t at element `first` (leading
// dimension ld) in place when t is F32, else widened into `copy` (contiguous; left
// unwidened when `load` is false, for a result the first GEMM overwrites).
class F32Block {
 public:
  F32Block(ClContext& cl, const Tensor& t, int64_t first, int64_t rows, int64_t cols, int64_t ld, bool load = true)
      : t_(t), first_(first), rows_(rows), cols_(cols), ld_(ld) {
    if (t.dtype == DType::F32) return;
    copy_.emplace(cl, static_cast<size_t>(rows * cols) * sizeof(float));
    if (load) rows_plus_bias(copy_tensor(), cols, from(t, first, {rows, cols}), ld, Tensor(), rows, cols);
  }
  Operand operand() const {
    return copy_ ? Operand{copy_->mem(), 0, cols_} : Operand{cl_buffer(t_), cl_offset(t_) + first_, ld_};
  }
  // A widened copy rounds back into t once (an accumulated gradient).
  void store() const {
    if (copy_) rows_plus_bias(from(t_, first_, {rows_, cols_}), ld_, copy_tensor(), cols_, Tensor(), rows_, cols_);
  }

 private:
  Tensor copy_tensor() const { return Tensor(copy_->mem(), 0, DType::F32, {rows_, cols_}, t_.device); }
  const Tensor& t_;
  int64_t first_, rows_, cols_, ld_;
  std::optional<ClScratch> copy_;
};

// The 16-bit forward, by tiles of weight rows: y = inp @ W[o0:o1]^T in f32 scratch, then
// out[:, o0:o1] = round(y + bias[o0:o1]).
void forward_16bit(ClContext& cl, const Tensor& out, const Tensor& inp, const Tensor& weight, const Tensor& bias,
                   int64_t N, int64_t C, int64_t OC) {
  const F32Block x(cl, inp, 0, N, C, C);
  const int64_t tile = tile_rows(N, C);
  for (int64_t o0 = 0; o0 < OC; o0 += tile) {
    const int64_t rows = std::min(tile, OC - o0);
    const F32Block w(cl, weight, o0 * C, rows, C, C);
    const ClScratch y(cl, static_cast<size_t>(N * rows) * sizeof(float));
    sgemm(cl, false, true, N, rows, C, x.operand(), w.operand(), 0.0f, scratch_operand(y, rows));
    rows_plus_bias(from(out, o0, {N, rows}), OC, Tensor(y.mem(), 0, DType::F32, {N, rows}, out.device), rows,
                   bias.empty() ? Tensor() : from(bias, o0, {rows}), N, rows);
  }
}

// The 16-bit backward, by tiles of weight rows (dout's columns): dinp accumulates every
// tile's dout[:, o0:o1] @ W[o0:o1] in f32 (the first tile's GEMM overwrites it when
// assigning) and is rounded once at the end; each tile of dweight rows gets (or, with
// assign_dw, is) its dout[:, o0:o1]^T @ inp.
void backward_16bit(ClContext& cl, const Tensor& dinp, const Tensor& dweight, const Tensor& dout, const Tensor& inp,
                    const Tensor& weight, int64_t N, int64_t C, int64_t OC, bool assign, bool assign_dw) {
  std::optional<F32Block> dx, x;
  if (!dinp.empty()) dx.emplace(cl, dinp, 0, N, C, C, !assign);
  if (!dweight.empty()) x.emplace(cl, inp, 0, N, C, C);
  const int64_t tile = tile_rows(N, C);
  for (int64_t o0 = 0; o0 < OC; o0 += tile) {
    const int64_t rows = std::min(tile, OC - o0);
    const F32Block g(cl, dout, o0, N, rows, OC);
    if (dx) {
      const F32Block w(cl, weight, o0 * C, rows, C, C);
      sgemm(cl, false, false, N, C, rows, g.operand(), w.operand(), assign && o0 == 0 ? 0.0f : 1.0f, dx->operand());
    }
    if (x) {
      const F32Block dw(cl, dweight, o0 * C, rows, C, C, !assign_dw);
      sgemm(cl, true, false, rows, C, N, g.operand(), x->operand(), assign_dw ? 0.0f : 1.0f, dw.operand());
      dw.store();
    }
  }
  if (dx) dx->store();
}

}  // namespace

void linear_forward(Tensor out, Tensor inp, Tensor weight, Tensor bias) {
  check_linear_forward_shapes(out, inp, weight, bias);
  check_floating("linear_forward", {{"out", out}, {"inp", inp}, {"weight", weight}, {"bias", bias}});
  const int64_t C = inp.dim(-1), N = inp.numel() / C, OC = weight.dim(0);
  ClContext& cl = context_of(out);
  if (!all_f32({&out, &inp, &weight, &bias})) {
    if (C == 0) return bias.empty() ? fill_zero(out) : rows_plus_bias(out, OC, bias, 0, Tensor(), N, OC);
    return forward_16bit(cl, out, inp, weight, bias, N, C, OC);
  }
  // The bias broadcast into out, and the GEMM adds onto it.
  if (!bias.empty()) ClLaunch(cl, "broadcast_bias").floats(out).floats(bias).scalar<int64_t>(OC).run(OC, N);
  if (C == 0) {  // an empty product: out is the bias, or zeros
    if (bias.empty()) fill_zero(out);
    return;
  }
  sgemm(cl, false, true, N, OC, C, operand(inp, C), operand(weight, C), bias.empty() ? 0.0f : 1.0f, operand(out, OC));
}

void linear_backward_products(Tensor dinp, Tensor dweight, Tensor dbias, Tensor dout, Tensor inp, Tensor weight,
                              GradWrite write, GradWrite param_write) {
  check_linear_backward_shapes(dinp, dweight, dbias, dout, inp, weight);
  check_floating("linear_backward", {{"dinp", dinp}, {"dweight", dweight}, {"dbias", dbias}, {"dout", dout},
                                     {"inp", inp}, {"weight", weight}});
  const int64_t C = inp.dim(-1), N = inp.numel() / C, OC = weight.dim(0);
  ClContext& cl = context_of(dout);
  const bool assign = write == GradWrite::Assign, assign_dw = param_write == GradWrite::Assign;
  if (!dbias.empty()) column_sums(dbias, dout, param_write);
  if (OC == 0 || N == 0) {  // an empty product: zeros where assigning, nothing to add
    if (assign && !dinp.empty()) fill_zero(dinp);
    if (assign_dw && !dweight.empty()) fill_zero(dweight);
    return;
  }
  if (!all_f32({&dinp, &dweight, &dbias, &dout, &inp, &weight}))
    return backward_16bit(cl, dinp, dweight, dout, inp, weight, N, C, OC, assign, assign_dw);
  if (!dinp.empty())
    sgemm(cl, false, false, N, C, OC, operand(dout, OC), operand(weight, C), assign ? 0.0f : 1.0f, operand(dinp, C));
  if (!dweight.empty())
    sgemm(cl, true, false, OC, C, N, operand(dout, OC), operand(inp, C), assign_dw ? 0.0f : 1.0f, operand(dweight, C));
}

}  // namespace tessera::ops::opencl
