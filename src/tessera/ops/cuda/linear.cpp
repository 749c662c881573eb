// Linear layer on CUDA: the GEMMs through cuBLASLt, the bias through
// ops/kernels/elementwise.cl, its gradient as column sums in two passes (column_sums.h).
// Shapes and the dtype contract as ops/cpu/linear.cpp:
//   forward:  out[N,OC]  = inp[N,C] @ W[OC,C]^T + bias[OC]
//   backward: dinp[N,C] += dout @ W (= when assigning: beta 0);  dW[OC,C] += dout^T @ inp;
//             dbias[OC] += column sums (dW and dbias = when param_write assigns)
// All-F32 calls multiply f32 operands with f32 accumulation (CUBLAS_COMPUTE_32F: exact
// f32), or with TF32 operands when the device allows it (--tf32, device.h's
// set_tf32_matmul); the forward adds the bias in cuBLASLt's epilogue (cublaslt_gemm.h).
//
// 16-bit tensors (ops.h: any of inp, weight, bias, out, dinp, dout, dweight, dbias may be
// BF16 or F16): cuBLASLt multiplies bf16 or f16 operands natively
// (32F compute) when a GEMM's operands share their dtype, else every operand is widened
// into f32 scratch first (exact). C/D take the output's dtype, so cuBLASLt rounds each
// result once, after the f32 accumulation (and the epilogue's bias) and, for a gradient,
// after adding the old value (beta = 1); where cuBLASLt has no such type combination
// (f32 operands with a 16-bit output, a bias of another dtype than out) the GEMM lands in
// f32 scratch and a kernel adds and rounds once.
#include "tessera/ops/cuda/column_sums.h"
#include "tessera/ops/cuda/cublaslt_gemm.h"
#include "tessera/ops/cuda/cuda_launch.h"
#include "tessera/ops/cuda/cuda_ops.h"
#include "tessera/ops/kernels/float_args.h"
#include "tessera/ops/linear_shapes.h"

#define TESSERA_BACKEND cuda
#define TESSERA_OWN_COLUMN_SUMS  // column_sums.h
#include "tessera/ops/kernels/linear_host.inc"
#undef TESSERA_OWN_COLUMN_SUMS
#undef TESSERA_BACKEND

namespace tessera::ops::cuda {
namespace {

Tensor f32_at(void* p, int64_t rows, int64_t cols, const Tensor& like) {
  return Tensor(p, 0, DType::F32, {rows, cols}, like.device);
}

// t (rows x cols, contiguous) as the f32 operand in `dst` when `widen`, else in place.
const void* operand(void* dst, const Tensor& t, int64_t rows, int64_t cols, bool widen) {
  if (!widen || t.dtype == DType::F32) return memory(t);
  rows_plus_bias(f32_at(dst, rows, cols, t), cols, t, cols, Tensor(), rows, cols);
  return dst;
}

// dst[M,N] += op(A) @ op(B) (A, B of type ab; beta 0: = instead), rounded once into dst: by
// cuBLASLt directly when it takes dst's type with these operands, else through the f32
// scratch `tmp`.
void accumulate_gemm(const Tensor& dst, void* tmp, cudaDataType_t ab, bool ta, bool tb, int64_t M, int64_t N,
                     int64_t K, const void* A, int64_t lda, const void* B, int64_t ldb, float beta = 1.0f) {
  Device& device = *dst.device;
  if (ab != CUDA_R_32F || dst.dtype == DType::F32)
    return gemm(device, ab, ta, tb, M, N, K, A, lda, B, ldb, beta, memory(dst), N, nullptr, lt_type(dst.dtype));
  const Tensor acc = f32_at(tmp, M, N, dst);
  if (beta != 0.0f) rows_plus_bias(acc, N, dst, N, Tensor(), M, N);
  gemm(device, ab, ta, tb, M, N, K, A, lda, B, ldb, beta, tmp, N);
  rows_plus_bias(dst, N, acc, N, Tensor(), M, N);
}

void forward_16bit(const Tensor& out, const Tensor& inp, const Tensor& weight, const Tensor& bias, int64_t N,
                   int64_t C, int64_t OC) {
  const bool widen = inp.dtype != weight.dtype;
  const cudaDataType_t ab = widen ? CUDA_R_32F : lt_type(inp.dtype);
  const bool direct = (ab != CUDA_R_32F || out.dtype == DType::F32) && (bias.empty() || bias.dtype == out.dtype);
  if (direct && !widen) return linear_gemm(out, inp, weight, bias);
  const Pieces scratch(*out.device, {widen ? size_t(N * C) * 4 : 0, widen ? size_t(OC * C) * 4 : 0,
                                     direct ? 0 : size_t(N * OC) * 4});
  const void* x = operand(scratch[0], inp, N, C, widen);
  const void* w = operand(scratch[1], weight, OC, C, widen);
  if (direct)
    return gemm(*out.device, ab, false, true, N, OC, C, x, C, w, C, 0.0f, memory(out), OC, memory(bias),
                lt_type(out.dtype));
  gemm(*out.device, ab, false, true, N, OC, C, x, C, w, C, 0.0f, scratch[2], OC);
  rows_plus_bias(out, OC, f32_at(scratch[2], N, OC, out), OC, bias, N, OC);
}

void backward_16bit(const Tensor& dinp, const Tensor& dweight, const Tensor& dout, const Tensor& inp,
                    const Tensor& weight, int64_t N, int64_t C, int64_t OC, float dinp_beta, float dweight_beta) {
  const bool widen = dout.dtype != weight.dtype || dout.dtype != inp.dtype;
  const cudaDataType_t ab = widen ? CUDA_R_32F : lt_type(dout.dtype);
  auto via_scratch = [&](const Tensor& d) { return !d.empty() && ab == CUDA_R_32F && d.dtype != DType::F32; };
  const Pieces scratch(*dout.device, {widen ? size_t(N * OC) * 4 : 0, widen && !dinp.empty() ? size_t(OC * C) * 4 : 0,
                                      widen && !dweight.empty() ? size_t(N * C) * 4 : 0,
                                      via_scratch(dinp) ? size_t(N * C) * 4 : 0,
                                      via_scratch(dweight) ? size_t(OC * C) * 4 : 0});
  const void* g = operand(scratch[0], dout, N, OC, widen);
  if (!dinp.empty())
    accumulate_gemm(dinp, scratch[3], ab, false, false, N, C, OC, g, OC, operand(scratch[1], weight, OC, C, widen), C,
                    dinp_beta);
  if (!dweight.empty())
    accumulate_gemm(dweight, scratch[4], ab, true, false, OC, C, N, g, OC, operand(scratch[2], inp, N, C, widen), C,
                    dweight_beta);
}

}  // namespace

void linear_forward(Tensor out, Tensor inp, Tensor weight, Tensor bias) {
  check_linear_forward_shapes(out, inp, weight, bias);
  check_floating("linear_forward", {{"out", out}, {"inp", inp}, {"weight", weight}, {"bias", bias}});
  const int64_t C = inp.dim(-1), N = inp.numel() / C, OC = weight.dim(0);
  if (!all_f32({&out, &inp, &weight, &bias})) {
    if (C == 0) return bias.empty() ? fill_zero(out) : rows_plus_bias(out, OC, bias, 0, Tensor(), N, OC);
    return forward_16bit(out, inp, weight, bias, N, C, OC);
  }
  if (C == 0) {  // an empty product: out is the bias, or zeros
    if (bias.empty()) return fill_zero(out);
    CudaLaunch(out, "broadcast_bias").floats(out).floats(bias).scalar<int64_t>(OC).run(OC, N);
    return;
  }
  linear_gemm(out, inp, weight, bias);
}

void linear_backward_products(Tensor dinp, Tensor dweight, Tensor dbias, Tensor dout, Tensor inp, Tensor weight,
                              GradWrite write, GradWrite param_write) {
  check_linear_backward_shapes(dinp, dweight, dbias, dout, inp, weight);
  check_floating("linear_backward", {{"dinp", dinp}, {"dweight", dweight}, {"dbias", dbias}, {"dout", dout},
                                     {"inp", inp}, {"weight", weight}});
  const int64_t C = inp.dim(-1), N = inp.numel() / C, OC = weight.dim(0);
  Device& device = *dout.device;
  // cuBLASLt reads no C when beta is 0.
  const float dinp_beta = write == GradWrite::Assign ? 0.0f : 1.0f;
  const float dweight_beta = param_write == GradWrite::Assign ? 0.0f : 1.0f;
  if (!dbias.empty()) column_sums(dbias, dout, param_write);
  if (OC == 0 || N == 0) {  // an empty product: zeros where assigning, nothing to add
    if (dinp_beta == 0.0f && !dinp.empty()) fill_zero(dinp);
    if (dweight_beta == 0.0f && !dweight.empty()) fill_zero(dweight);
    return;
  }
  if (!all_f32({&dinp, &dweight, &dbias, &dout, &inp, &weight}))
    return backward_16bit(dinp, dweight, dout, inp, weight, N, C, OC, dinp_beta, dweight_beta);
  if (!dinp.empty())
    gemm(device, CUDA_R_32F, false, false, N, C, OC, f32(dout), OC, f32(weight), C, dinp_beta, f32(dinp), C);
  if (!dweight.empty())
    gemm(device, CUDA_R_32F, true, false, OC, C, N, f32(dout), OC, f32(inp), C, dweight_beta, f32(dweight), C);
}

}  // namespace tessera::ops::cuda
