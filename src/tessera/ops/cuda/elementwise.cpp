// Element-wise ops on CUDA (ops/kernels/elementwise.cl): residual, GeLU, dropout, scaling.
// Checks as ops/cpu/residual.cpp, gelu.cpp, dropout.cpp, reductions.cpp.
#include "tessera/ops/cuda/cuda_launch.h"
#include "tessera/ops/cuda/cuda_ops.h"

namespace tessera::ops::cuda {
namespace {

// Philox groups of 4 that the elements [element_offset, element_offset + S) touch.
int64_t dropout_groups(const Dropout& d, int64_t S) {
  return static_cast<int64_t>((d.element_offset + static_cast<uint64_t>(S) - 1) / 4 - d.element_offset / 4 + 1);
}

int64_t batch_dim(const Tensor& t) {
  TESSERA_CHECK(t.ndim() >= 1 && t.dim(0) > 0, "dropout needs a leading batch dimension, got " + shape_str(t.shape));
  return t.dim(0);
}

void check_dropout(const Dropout& dropout) {
  TESSERA_CHECK(dropout.p >= 0.0f && dropout.p < 1.0f, "dropout probability must be in [0, 1)");
}

// dst += src over n elements.
void accumulate(const Tensor& dst, const Tensor& src) {
  CudaLaunch(dst, "accumulate").tensor(dst).tensor(src).run(dst.numel());
}

}  // namespace

void residual_forward(Tensor out, Tensor a, Tensor b) {
  const int64_t n = out.numel();
  TESSERA_CHECK(a.numel() == n && b.numel() == n, "residual: out " + shape_str(out.shape) + ", a " +
                                                      shape_str(a.shape) + ", b " + shape_str(b.shape));
  CudaLaunch(out, "residual_forward").tensor(out).tensor(a).tensor(b).run(n);
}

void residual_backward(Tensor da, Tensor db, Tensor dout) {
  const int64_t n = dout.numel();
  // Accumulating a buffer into itself would double it (see ops/cpu/residual.cpp).
  TESSERA_CHECK(!da.same_memory(dout) && !db.same_memory(dout), "residual backward: a gradient output aliases dout");
  if (!da.empty()) {
    TESSERA_CHECK(da.numel() == n, "residual backward: da " + shape_str(da.shape));
    accumulate(da, dout);
  }
  if (!db.empty()) {
    TESSERA_CHECK(db.numel() == n, "residual backward: db " + shape_str(db.shape));
    accumulate(db, dout);
  }
}

void gelu_forward(Tensor out, Tensor inp, GeluKind kind) {
  TESSERA_CHECK(out.numel() == inp.numel(), "gelu: out " + shape_str(out.shape) + " vs inp " + shape_str(inp.shape));
  CudaLaunch(out, "gelu_forward").tensor(out).tensor(inp).scalar<int32_t>(kind == GeluKind::Erf).run(inp.numel());
}

void gelu_backward(Tensor dinp, Tensor dout, Tensor inp, GeluKind kind) {
  if (dinp.empty()) return;
  const int64_t n = inp.numel();
  TESSERA_CHECK(dinp.numel() == n && dout.numel() == n, "gelu backward: dinp " + shape_str(dinp.shape) + ", dout " +
                                                            shape_str(dout.shape) + ", inp " + shape_str(inp.shape));
  CudaLaunch(dinp, "gelu_backward")
      .tensor(dinp)
      .tensor(dout)
      .tensor(inp)
      .scalar<int32_t>(kind == GeluKind::Erf)
      .run(n);
}

void dropout_forward(Tensor out, Tensor inp, const Dropout& dropout) {
  TESSERA_CHECK(out.numel() == inp.numel(), "dropout: out " + shape_str(out.shape) + " vs inp " + shape_str(inp.shape));
  if (dropout.p == 0.0f) {  // disabled: out = inp
    if (!out.same_memory(inp)) copy_tensor(out.view(inp.shape), inp);
    return;
  }
  check_dropout(dropout);
  const int64_t B = batch_dim(inp), S = inp.numel() / B;
  CudaLaunch(out, "dropout_forward")
      .tensor(out)
      .tensor(inp)
      .scalar<int64_t>(S)
      .dropout(dropout)
      .run(dropout_groups(dropout, S), B);
}

void dropout_backward(Tensor dinp, Tensor dout, const Dropout& dropout) {
  if (dinp.empty()) return;
  TESSERA_CHECK(dinp.numel() == dout.numel(), "dropout: dinp " + shape_str(dinp.shape) + " vs dout " +
                                                  shape_str(dout.shape));
  if (dropout.p == 0.0f) return accumulate(dinp, dout);
  check_dropout(dropout);
  const int64_t B = batch_dim(dout), S = dout.numel() / B;
  CudaLaunch(dinp, "dropout_backward")
      .tensor(dinp)
      .tensor(dout)
      .scalar<int64_t>(S)
      .dropout(dropout)
      .run(dropout_groups(dropout, S), B);
}

void scale_inplace(Tensor t, float scale) {
  CudaLaunch(t, "scale_inplace").tensor(t).scalar<float>(scale).run(t.numel());
}

void fill(Tensor out, float value) {
  out.check_dtype(DType::F32);
  CudaLaunch(out, "fill").tensor(out).scalar<float>(value).run(out.numel());
}

void masked_loss_backward(Tensor dlosses, Tensor mask, float scale) {
  TESSERA_CHECK(dlosses.numel() == mask.numel(), "masked_loss_backward: dlosses " + shape_str(dlosses.shape) +
                                                     ", mask " + shape_str(mask.shape));
  CudaLaunch(dlosses, "masked_loss_backward").tensor(dlosses).tensor(mask).scalar<float>(scale).run(dlosses.numel());
}

}  // namespace tessera::ops::cuda
