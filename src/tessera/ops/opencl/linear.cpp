// Linear layer on OpenCL: the GEMMs through CLBlast (CLBlastSgemm on row-major buffers
// with element offsets), the bias and its gradient through kernels/elementwise.cl. Shapes
// and the MathMode contract as ops/cpu/linear.cpp:
//   forward:  out[N,OC]  = inp[N,C] @ W[OC,C]^T + bias[OC]
//   backward: dinp[N,C] += dout @ W;  dW[OC,C] += dout^T @ inp;  dbias[OC] += column sums
// BF16 and FP16 round each GEMM's operands into scratch buffers (round_block) and call
// the f32 GEMM on them: a product of two bfloat16 or two half values is exact in f32, so
// this is the arithmetic of a 16-bit GEMM with f32 accumulation (what the CPU backend
// does too when it has no native bf16 kernel). FP16 also rounds each result to half before
// it lands in its f32 output or gradient. Unlike the CPU, the weight is not tiled: the
// scratch holds a whole rounded copy of W and of dout (fine for the sizes PoCL runs).
#include "tessera/ops/opencl/cl_launch.h"
#include "tessera/ops/opencl/opencl_ops.h"

#include <clblast_c.h>

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

enum Rounding : int32_t { kBf16 = 1, kFp16 = 2 };

int32_t rounding(MathMode mode) { return mode == MathMode::BF16 ? kBf16 : kFp16; }

// A rows x cols block of `src` (leading dimension ld) rounded into a fresh contiguous
// scratch buffer.
ClScratch rounded(ClContext& cl, const Tensor& src, int64_t rows, int64_t cols, int64_t ld, int32_t mode) {
  ClScratch dst(cl, static_cast<size_t>(rows * cols) * sizeof(float));
  ClLaunch(cl, "round_block")
      .buffer(dst.mem())
      .tensor(src)
      .scalar<int64_t>(cols)
      .scalar<int64_t>(ld)
      .scalar<int32_t>(mode)
      .run(cols, rows);
  return dst;
}

Operand scratch_operand(const ClScratch& s, int64_t ld) { return {s.mem(), 0, ld}; }

// dst += round_fp16(src[0 .. n)).
void add_rounded_fp16(ClContext& cl, const Tensor& dst, const ClScratch& src, int64_t n) {
  ClLaunch(cl, "add_rounded_fp16").tensor(dst).buffer(src.mem()).run(n);
}

void column_sums(const Tensor& dbias, const Tensor& dout, bool round_half) {
  const int64_t OC = dbias.numel(), N = dout.numel() / OC;
  ClLaunch(dout, "column_sums")
      .tensor(dbias)
      .tensor(dout)
      .scalar<int64_t>(N)
      .scalar<int64_t>(OC)
      .scalar<int32_t>(round_half ? 1 : 0)
      .run(OC);
}

void check_forward(const Tensor& out, const Tensor& inp, const Tensor& weight, const Tensor& bias) {
  const int64_t C = inp.dim(-1), N = inp.numel() / C, OC = weight.dim(0);
  TESSERA_CHECK(weight.ndim() == 2 && weight.dim(1) == C && out.numel() == N * OC && out.dim(-1) == OC &&
                    (bias.empty() || bias.numel() == OC),
                "linear: inp " + shape_str(inp.shape) + ", weight " + shape_str(weight.shape) + ", out " +
                    shape_str(out.shape));
}

void check_backward(const Tensor& dinp, const Tensor& dweight, const Tensor& dbias, const Tensor& dout,
                    const Tensor& inp, const Tensor& weight) {
  const int64_t C = inp.dim(-1), N = inp.numel() / C, OC = weight.dim(0);
  TESSERA_CHECK(weight.ndim() == 2 && weight.dim(1) == C && dout.numel() == N * OC && dout.dim(-1) == OC,
                "linear backward: dout " + shape_str(dout.shape) + ", inp " + shape_str(inp.shape) + ", weight " +
                    shape_str(weight.shape));
  TESSERA_CHECK((dinp.empty() || dinp.numel() == N * C) && (dweight.empty() || dweight.numel() == OC * C) &&
                    (dbias.empty() || dbias.numel() == OC),
                "linear backward: gradient shapes");
}

}  // namespace

void linear_forward(Tensor out, Tensor inp, Tensor weight, Tensor bias, MathMode mode) {
  check_forward(out, inp, weight, bias);
  const int64_t C = inp.dim(-1), N = inp.numel() / C, OC = weight.dim(0);
  ClContext& cl = context_of(out);
  // The bias broadcast into out (rounded to half for FP16), and the GEMM adds onto it.
  const bool fp16 = mode == MathMode::FP16;
  if (!bias.empty())
    ClLaunch(cl, "broadcast_bias").tensor(out).tensor(bias).scalar<int64_t>(OC).scalar<int32_t>(fp16).run(OC, N);
  const float beta = bias.empty() ? 0.0f : 1.0f;
  if (C == 0) {  // an empty product: out is the bias, or zeros
    if (bias.empty()) fill_zero(out);
    return;
  }
  if (mode == MathMode::F32) {
    sgemm(cl, false, true, N, OC, C, operand(inp, C), operand(weight, C), beta, operand(out, OC));
    return;
  }
  const ClScratch x = rounded(cl, inp, N, C, C, rounding(mode));
  const ClScratch w = rounded(cl, weight, OC, C, C, rounding(mode));
  sgemm(cl, false, true, N, OC, C, scratch_operand(x, C), scratch_operand(w, C), beta, operand(out, OC));
  if (fp16) ClLaunch(cl, "round_fp16_inplace").tensor(out).run(N * OC);
}

void linear_backward(Tensor dinp, Tensor dweight, Tensor dbias, Tensor dout, Tensor inp, Tensor weight,
                     MathMode mode) {
  check_backward(dinp, dweight, dbias, dout, inp, weight);
  const int64_t C = inp.dim(-1), N = inp.numel() / C, OC = weight.dim(0);
  ClContext& cl = context_of(dout);
  if (mode == MathMode::F32) {
    if (!dinp.empty()) sgemm(cl, false, false, N, C, OC, operand(dout, OC), operand(weight, C), 1.0f, operand(dinp, C));
    if (!dweight.empty())
      sgemm(cl, true, false, OC, C, N, operand(dout, OC), operand(inp, C), 1.0f, operand(dweight, C));
    if (!dbias.empty()) column_sums(dbias, dout, false);
    return;
  }
  const bool fp16 = mode == MathMode::FP16;
  // BF16: the bias gradient is the f32 column sum of dout, as in F32.
  if (!fp16 && !dbias.empty()) column_sums(dbias, dout, false);
  if (dinp.empty() && dweight.empty() && !(fp16 && !dbias.empty())) return;
  const ClScratch g = rounded(cl, dout, N, OC, OC, rounding(mode));
  if (!dinp.empty()) {
    const ClScratch w = rounded(cl, weight, OC, C, C, rounding(mode));
    if (fp16) {
      const ClScratch dx(cl, static_cast<size_t>(N * C) * sizeof(float));
      sgemm(cl, false, false, N, C, OC, scratch_operand(g, OC), scratch_operand(w, C), 0.0f, scratch_operand(dx, C));
      add_rounded_fp16(cl, dinp, dx, N * C);
    } else {
      sgemm(cl, false, false, N, C, OC, scratch_operand(g, OC), scratch_operand(w, C), 1.0f, operand(dinp, C));
    }
  }
  if (!dweight.empty()) {
    const ClScratch x = rounded(cl, inp, N, C, C, rounding(mode));
    if (fp16) {
      const ClScratch dw(cl, static_cast<size_t>(OC * C) * sizeof(float));
      sgemm(cl, true, false, OC, C, N, scratch_operand(g, OC), scratch_operand(x, C), 0.0f, scratch_operand(dw, C));
      add_rounded_fp16(cl, dweight, dw, OC * C);
    } else {
      sgemm(cl, true, false, OC, C, N, scratch_operand(g, OC), scratch_operand(x, C), 1.0f, operand(dweight, C));
    }
  }
  if (fp16 && !dbias.empty()) {
    // The column sums of the half-rounded dout, each rounded to half (ops/cpu/linear.cpp).
    const Tensor g_tensor(g.mem(), 0, DType::F32, {N, OC}, dout.device);
    column_sums(dbias, g_tensor, true);
  }
}

void bias_add_forward(Tensor out, Tensor inp, Tensor bias) {
  const int64_t OC = bias.numel();
  TESSERA_CHECK(OC > 0 && out.ndim() >= 1 && out.dim(-1) == OC && inp.numel() == out.numel() && inp.dim(-1) == OC,
                "bias_add: out " + shape_str(out.shape) + ", inp " + shape_str(inp.shape) + ", bias " +
                    shape_str(bias.shape));
  ClLaunch(out, "bias_add_forward").tensor(out).tensor(inp).tensor(bias).scalar<int64_t>(OC).run(OC, out.numel() / OC);
}

void bias_add_backward(Tensor dbias, Tensor dout) {
  const int64_t OC = dbias.numel();
  TESSERA_CHECK(OC > 0 && dout.ndim() >= 1 && dout.dim(-1) == OC,
                "bias_add backward: dbias " + shape_str(dbias.shape) + ", dout " + shape_str(dout.shape));
  column_sums(dbias, dout, false);
}

}  // namespace tessera::ops::opencl
