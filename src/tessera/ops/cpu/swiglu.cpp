// SwiGLU (Megatron's --swiglu, megatron/core/transformer/mlp.py glu): out = silu(gate) * up
// with each input row [gate | up], silu(x) = x / (1 + exp(-x)), exp as fast_math.h's
// exp_approx (2 ulp), so the loops vectorise.
//   d out / d gate = up * s (1 + gate (1 - s)), s = sigmoid(gate); d out / d up = silu(gate).
// Legend: N rows, F the width of each half. inp, dinp: [N,2F]; out, dout: [N,F]; any float
// dtype each, staged by rows (storage.h).
#include "tessera/ops/cpu/cpu_ops.h"
#include "tessera/ops/cpu/fast_math.h"
#include "tessera/ops/cpu/shape_checks.h"
#include "tessera/ops/cpu/storage.h"

namespace tessera::ops::cpu {

void swiglu_forward(Tensor out, Tensor inp) {
  const int64_t F = swiglu_width(inp, out, "swiglu_forward"), N = out.numel() / F;
  check_float(out, "swiglu_forward", "out");
  check_float(inp, "swiglu_forward", "inp");
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < N; ++n) {
    Stage s;
    const float* gate = s.in(inp, n * 2 * F, F);
    const float* up = s.in(inp, n * 2 * F + F, F);
    float* y = s.out(out, n * F, F);
#pragma omp simd
    for (int64_t f = 0; f < F; ++f) y[f] = gate[f] / (1.0f + exp_approx(-gate[f])) * up[f];
    s.done(out, n * F, F, y);
  }
}

void swiglu_backward(Tensor dinp, Tensor dout, Tensor inp, GradWrite write) {
  if (dinp.empty()) return;
  const int64_t F = swiglu_width(inp, dout, "swiglu_backward"), N = dout.numel() / F;
  TESSERA_CHECK(dinp.numel() == inp.numel(),
                "swiglu_backward: dinp " + shape_str(dinp.shape) + " vs inp " + shape_str(inp.shape));
  check_float(dinp, "swiglu_backward", "dinp");
  check_float(dout, "swiglu_backward", "dout");
  check_float(inp, "swiglu_backward", "inp");
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < N; ++n) {
    Stage s;
    const float* gate = s.in(inp, n * 2 * F, F);
    const float* up = s.in(inp, n * 2 * F + F, F);
    const float* dy = s.in(dout, n * F, F);
    float* dgate = s.grad(dinp, n * 2 * F, F, write);
    float* dup = s.grad(dinp, n * 2 * F + F, F, write);
#pragma omp simd
    for (int64_t f = 0; f < F; ++f) {
      const float g = gate[f], e = 1.0f + exp_approx(-g);
      const float sg = 1.0f / e;
      dgate[f] += dy[f] * up[f] * (sg * (1.0f + g * (1.0f - sg)));
      dup[f] += dy[f] * (g / e);
    }
    s.done(dinp, n * 2 * F, F, dgate);
    s.done(dinp, n * 2 * F + F, F, dup);
  }
}

}  // namespace tessera::ops::cpu
