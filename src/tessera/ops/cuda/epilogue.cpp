// CUDA's fused epilogues (ops.inc), each on CUDA's own kernels where they serve the call and
// ops/kernels/epilogue_host.inc's shared kernels otherwise:
// - linear_bias_gelu_forward with tanh GeLU: one cuBLASLt GEMM with the GELU_AUX(_BIAS)
//   epilogue (out = gelu(inp @ W^T + bias), pre kept as its aux matrix);
// - linear_bias_gelu_backward: the native dgelu pass (epilogue_kernels.h), the bias gradient
//   as column_sums.h's two-pass sum of dpre as stored, then linear_backward's GEMMs.
//   cuBLASLt's DGELU_BGRAD epilogue would fuse into the GEMM that produces dout (the next
//   linear's input gradient), which this op's interface does not see;
// - bias_dropout_add_backward: the native element-wise pass (the same Philox mask), then the
//   two-pass column sums of the contributions as stored.
// The native kernels take tensors of one dtype; mixed dtypes run the shared kernels.
#include <optional>

#include "tessera/ops/cuda/column_sums.h"
#include "tessera/ops/cuda/cublaslt_gemm.h"
#include "tessera/ops/cuda/cuda_launch.h"
#include "tessera/ops/cuda/cuda_ops.h"
#include "tessera/ops/cuda/epilogue_kernels.h"

#define TESSERA_BACKEND cuda
#define TESSERA_OWN_EPILOGUES
#include "tessera/ops/kernels/epilogue_host.inc"
#undef TESSERA_OWN_EPILOGUES
#undef TESSERA_BACKEND

namespace tessera::ops::cuda {
namespace {


// Whether cuBLASLt's GELU_AUX(_BIAS) epilogue computes the op as its contract says: tanh GeLU,
// operands of one dtype multiplied natively, out, pre and bias of one dtype, the aux matrix's
// leading dimension a multiple of 8 elements (cuBLASLt's rule) and the operands 16-byte
// aligned, a non-empty product.
bool gelu_epilogue_serves(const Tensor& out, const Tensor& pre, const Tensor& inp, const Tensor& weight,
                          const Tensor& bias, GeluKind kind) {
  const int64_t C = inp.dim(-1), OC = weight.dim(0);
  const bool same_out = out.dtype == pre.dtype && (bias.empty() || bias.dtype == out.dtype);
  const bool operands = inp.dtype == weight.dtype && (inp.dtype != DType::F32 || out.dtype == DType::F32);
  bool aligned = true;
  for (const Tensor* t : {&out, &pre, &inp, &weight, &bias})
    if (!t->empty() && reinterpret_cast<uintptr_t>(memory(*t)) % 16 != 0) aligned = false;
  return kind == GeluKind::Tanh && same_out && operands && aligned && C > 0 && OC % 8 == 0;
}

// The dtype every present tensor has, or nothing.
std::optional<DType> one_dtype(std::initializer_list<const Tensor*> tensors) {
  std::optional<DType> d;
  for (const Tensor* t : tensors) {
    if (t->empty()) continue;
    if (d && *d != t->dtype) return std::nullopt;
    d = t->dtype;
  }
  return d;
}

}  // namespace

void linear_bias_gelu_forward(Tensor out, Tensor pre, Tensor inp, Tensor weight, Tensor bias, GeluKind kind) {
  check_linear_bias_gelu(out, pre, inp, weight, bias);
  if (!gelu_epilogue_serves(out, pre, inp, weight, bias, kind))
    return shared_linear_bias_gelu_forward(out, pre, inp, weight, bias, kind);
  linear_gemm(out, inp, weight, bias, pre);
}

void linear_bias_gelu_backward(Tensor dinp, Tensor dweight, Tensor dbias, Tensor dpre, Tensor dout, Tensor inp,
                               Tensor weight, Tensor pre, GeluKind kind, GradWrite write, GradWrite param_write,
                               GradSquares dweight_squares) {
  check_linear_bias_gelu_backward(dbias, dpre, dout, weight, pre);
  const std::optional<DType> dtype = one_dtype({&dpre, &dout, &pre});
  if (!dtype)
    return shared_linear_bias_gelu_backward(dinp, dweight, dbias, dpre, dout, inp, weight, pre, kind, write,
                                            param_write, dweight_squares);
  native::dgelu(*dtype, memory(dpre), memory(dout), memory(pre), pre.numel(), kind == GeluKind::Erf, stream_of(pre));
  if (!dbias.empty()) column_sums(dbias, dpre, param_write);
  linear_backward(dinp, dweight, Tensor(), dpre, inp, weight, write, param_write, dweight_squares);
}

void bias_dropout_add_backward(Tensor dinp, Tensor dbias, Tensor dresidual, Tensor dout, const Dropout& dropout,
                               GradWrite write) {
  check_bias_dropout_add_backward(dinp, dbias, dresidual, dout);
  const std::optional<DType> dtype = one_dtype({&dinp, &dresidual, &dout});
  if (!dtype) return shared_bias_dropout_add_backward(dinp, dbias, dresidual, dout, dropout, write);
  const int64_t n = dout.numel(), OC = dout.dim(-1), N = n / OC, B = samples(dout, dropout, "bias_dropout_add_backward");
  check_dropout_iteration(dropout, *dout.device);
  const native::DropoutArgs d{dropout.p,
                              dropout.p > 0.0f ? 1.0f / (1.0f - dropout.p) : 1.0f,
                              dropout.key.seed,
                              dropout.key.site,
                              dropout.key.iteration,
                              dropout.sample0,
                              dropout.element_offset,
                              n / B,
                              memory<const uint32_t>(dropout.iteration)};
  const bool assign = write == GradWrite::Assign;
  // The bias gradient sums the contributions as stored: dinp itself when it is assigned, else
  // a copy in scratch beside the column sums' partials.
  const bool own_contrib = !dbias.empty() && (dinp.empty() || !assign);
  const Pieces scratch(*dout.device,
                       {own_contrib ? dout.bytes() : 0, dbias.empty() ? 0 : column_partials_bytes(N, OC)});
  void* contrib = own_contrib ? scratch[0] : nullptr;
  native::bias_dropout_add_grad(*dtype, memory(dinp), contrib, memory(dresidual), memory(dout), n, assign, d,
                                stream_of(dout));
  if (dbias.empty()) return;
  const Tensor summed = own_contrib ? Tensor(contrib, 0, dout.dtype, dout.shape, dout.device) : dinp;
  column_sums(dbias, summed, scratch[1], GradWrite::Accumulate);
}

}  // namespace tessera::ops::cuda
