// GeLU, both of Megatron's variants, with their exact derivatives (gelu_math.h). Tensors of
// any float dtype, staged in chunks (storage.h).
#include "tessera/ops/cpu/cpu_ops.h"
#include "tessera/ops/cpu/gelu_math.h"
#include "tessera/ops/cpu/storage.h"

namespace tessera::ops::cpu {

void gelu_forward(Tensor out, Tensor inp, GeluKind kind) {
  const int64_t n = inp.numel();
  TESSERA_CHECK(out.numel() == n, "gelu: out " + shape_str(out.shape) + " vs inp " + shape_str(inp.shape));
  check_float(out, "gelu_forward", "out");
  check_float(inp, "gelu_forward", "inp");
  for_chunks(n, [&](int64_t off, int64_t len) {
    Stage s;
    const float* x = s.in(inp, off, len);
    float* y = s.out(out, off, len);
    if (kind == GeluKind::Tanh) {
#pragma omp simd
      for (int64_t i = 0; i < len; ++i) y[i] = gelu_tanh(x[i]);
    } else {
#pragma omp simd
      for (int64_t i = 0; i < len; ++i) y[i] = gelu_erf(x[i]);
    }
    s.done(out, off, len, y);
  });
}

void gelu_backward(Tensor dinp, Tensor dout, Tensor inp, GeluKind kind, GradWrite write) {
  if (dinp.empty()) return;
  const int64_t n = inp.numel();
  TESSERA_CHECK(dinp.numel() == n && dout.numel() == n, "gelu backward: dinp " + shape_str(dinp.shape) + ", dout " +
                                                            shape_str(dout.shape) + ", inp " + shape_str(inp.shape));
  check_float(dinp, "gelu_backward", "dinp");
  check_float(dout, "gelu_backward", "dout");
  check_float(inp, "gelu_backward", "inp");
  for_chunks(n, [&](int64_t off, int64_t len) {
    Stage s;
    const float* x = s.in(inp, off, len);
    const float* dy = s.in(dout, off, len);
    float* dx = s.grad(dinp, off, len, write);
    if (kind == GeluKind::Tanh) {
#pragma omp simd
      for (int64_t i = 0; i < len; ++i) dx[i] += dy[i] * gelu_tanh_grad(x[i]);
    } else {
#pragma omp simd
      for (int64_t i = 0; i < len; ++i) dx[i] += dy[i] * gelu_erf_grad(x[i]);
    }
    s.done(dinp, off, len, dx);
  });
}

}  // namespace tessera::ops::cpu
