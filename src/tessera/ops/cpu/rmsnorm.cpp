// RMSNorm over the last dimension (Megatron's --normalization RMSNorm, torch.nn.RMSNorm):
// out = inp * rstd * weight, rstd = 1 / sqrt(mean(inp^2) + eps).
// Legend: N rows, C channels. inp, out, dout, dinp: [N,C]; weight, dweight: [C]; rstd: f32 [N].
// inp, out, weight and their gradients may be of any float dtype (staged by rows or row
// groups, storage.h).
#include <algorithm>
#include <cmath>
#include <utility>

#include "tessera/ops/cpu/cpu_ops.h"
#include "tessera/ops/cpu/norm_grads.h"
#include "tessera/ops/cpu/storage.h"

namespace tessera::ops::cpu {

void rmsnorm_forward(Tensor out, Tensor rstd, Tensor inp, Tensor weight, float eps) {
  const int64_t C = inp.dim(-1), N = inp.numel() / C;
  TESSERA_CHECK(out.numel() == N * C && weight.numel() == C,
                "rmsnorm: inp " + shape_str(inp.shape) + ", out " + shape_str(out.shape) + ", weight " +
                    shape_str(weight.shape));
  TESSERA_CHECK(rstd.empty() || rstd.numel() == N,
                "rmsnorm: rstd must have one entry per row (" + std::to_string(N) + ")");
  for (auto [t, name] : {std::pair{&out, "out"}, {&inp, "inp"}, {&weight, "weight"}})
    check_float(*t, "rmsnorm_forward", name);
  float* r_out = f32_arg(rstd, "rmsnorm_forward", "rstd");
  Stage params(Stage::Caller);
  const float* w = params.in(weight, 0, C);
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < N; ++n) {
    Stage s;
    const float* xn = s.in(inp, n * C, C);
    float sq = 0.0f;
#pragma omp simd reduction(+ : sq)
    for (int64_t c = 0; c < C; ++c) sq += xn[c] * xn[c];
    const float rs = 1.0f / std::sqrt(sq / static_cast<float>(C) + eps);
    float* yn = s.out(out, n * C, C);
#pragma omp simd
    for (int64_t c = 0; c < C; ++c) yn[c] = xn[c] * rs * w[c];
    s.done(out, n * C, C, yn);
    if (r_out) r_out[n] = rs;
  }
}

void rmsnorm_backward(Tensor dinp, Tensor dweight, Tensor dout, Tensor inp, Tensor weight, Tensor rstd,
                      GradWrite write) {
  const int64_t C = inp.dim(-1), N = inp.numel() / C;
  TESSERA_CHECK(dout.numel() == N * C && weight.numel() == C && rstd.numel() == N,
                "rmsnorm backward: dout " + shape_str(dout.shape) + ", inp " + shape_str(inp.shape) + ", rstd " +
                    shape_str(rstd.shape));
  TESSERA_CHECK((dinp.empty() || dinp.numel() == N * C) && (dweight.empty() || dweight.numel() == C),
                "rmsnorm backward: gradient shapes");
  for (auto [t, name] : {std::pair{&dinp, "dinp"}, {&dweight, "dweight"}, {&dout, "dout"}, {&inp, "inp"},
                         {&weight, "weight"}})
    check_float(*t, "rmsnorm_backward", name);
  const float* rs = f32_arg(rstd, "rmsnorm_backward", "rstd");

  // dinp, row by row. With xhat = x * rstd and g = dout * weight, differentiating through
  // rstd (d rstd / dx_c = -rstd^3 x_c / C) gives dx = rstd * (g - xhat * mean(g * xhat)).
  if (!dinp.empty()) {
    Stage params(Stage::Caller);
    const float* w = params.in(weight, 0, C);
#pragma omp parallel for schedule(static)
    for (int64_t n = 0; n < N; ++n) {
      Stage s;
      const float* xn = s.in(inp, n * C, C);
      const float* dyn = s.in(dout, n * C, C);
      const float r = rs[n];
      float gx_sum = 0.0f;
#pragma omp simd reduction(+ : gx_sum)
      for (int64_t c = 0; c < C; ++c) gx_sum += dyn[c] * w[c] * (xn[c] * r);
      const float gx_mean = gx_sum / static_cast<float>(C);
      float* dxn = s.grad(dinp, n * C, C, write);
#pragma omp simd
      for (int64_t c = 0; c < C; ++c) dxn[c] += (dyn[c] * w[c] - xn[c] * r * gx_mean) * r;
      s.done(dinp, n * C, C, dxn);
    }
  }

  // dweight = sum over rows of dout * xhat (no bias), as LayerNorm's.
  norm_affine_grads(dweight, Tensor(), dout, inp, nullptr, rs);
}

}  // namespace tessera::ops::cpu
