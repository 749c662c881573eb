// CUDA's fused epilogues: ops/kernels/epilogue_host.inc's shared kernels around cuBLASLt's
// GEMMs (linear.cpp), except linear_bias_gelu_forward with tanh GeLU, which is one cuBLASLt
// GEMM with the GELU_AUX_BIAS epilogue (out = gelu(inp @ W^T + bias), pre kept as its aux
// matrix) where cuBLASLt takes the dtypes natively. The backward stays the shared dgelu_bgrad
// pass then linear_backward's GEMMs: cuBLASLt's DGELU_BGRAD epilogue fuses into the GEMM that
// produces dout (the next linear's input gradient), which this op's interface does not see.
#include "tessera/ops/cuda/cublaslt_gemm.h"
#include "tessera/ops/cuda/cuda_launch.h"
#include "tessera/ops/cuda/cuda_ops.h"

#define TESSERA_BACKEND cuda
#define TESSERA_OWN_LINEAR_BIAS_GELU_FORWARD
#include "tessera/ops/kernels/epilogue_host.inc"
#undef TESSERA_OWN_LINEAR_BIAS_GELU_FORWARD
#undef TESSERA_BACKEND

namespace tessera::ops::cuda {
namespace {

cudaDataType_t lt_type(DType t) {
  return t == DType::BF16 ? CUDA_R_16BF : t == DType::F16 ? CUDA_R_16F : CUDA_R_32F;
}
void* memory(const Tensor& t) { return t.empty() ? nullptr : static_cast<char*>(t.handle) + t.offset; }

// Whether cuBLASLt's GELU_AUX(_BIAS) epilogue computes the op as its contract says: tanh GeLU,
// operands of one dtype multiplied natively, out, pre and bias of one dtype, the aux matrix's
// leading dimension a multiple of 8 elements (cuBLASLt's rule) and the operands 16-byte
// aligned, a non-empty product.
bool epilogue_serves(const Tensor& out, const Tensor& pre, const Tensor& inp, const Tensor& weight,
                     const Tensor& bias, GeluKind kind) {
  const int64_t C = inp.dim(-1), OC = weight.dim(0);
  const bool same_out = out.dtype == pre.dtype && (bias.empty() || bias.dtype == out.dtype);
  const bool operands = inp.dtype == weight.dtype && (inp.dtype != DType::F32 || out.dtype == DType::F32);
  bool aligned = true;
  for (const Tensor* t : {&out, &pre, &inp, &weight, &bias})
    if (!t->empty() && reinterpret_cast<uintptr_t>(memory(*t)) % 16 != 0) aligned = false;
  return kind == GeluKind::Tanh && same_out && operands && aligned && C > 0 && OC % 8 == 0;
}

}  // namespace

void linear_bias_gelu_forward(Tensor out, Tensor pre, Tensor inp, Tensor weight, Tensor bias, GeluKind kind) {
  check_linear_bias_gelu(out, pre, inp, weight, bias);
  if (!epilogue_serves(out, pre, inp, weight, bias, kind))
    return shared_linear_bias_gelu_forward(out, pre, inp, weight, bias, kind);
  const int64_t C = inp.dim(-1), N = inp.numel() / C, OC = weight.dim(0);
  gemm(*out.device, lt_type(inp.dtype), false, true, N, OC, C, memory(inp), C, memory(weight), C, 0.0f, memory(out),
       OC, memory(bias), lt_type(out.dtype), GemmBatch{}, memory(pre));
}

}  // namespace tessera::ops::cuda
