// LayerNorm over the last dimension (torch.nn.LayerNorm, biased variance).
// Legend: N rows, C channels. inp, out, dout, dinp: [N,C]; weight, bias: [C]; mean, rstd: [N].
// inp, out, weight, bias and their gradients may be of any float dtype (staged by rows or
// row groups, storage.h); mean and rstd are f32.
#include <algorithm>
#include <cmath>
#include <utility>

#include "tessera/ops/cpu/cpu_ops.h"
#include "tessera/ops/cpu/norm_grads.h"
#include "tessera/ops/cpu/storage.h"

namespace tessera::ops::cpu {

void layernorm_forward(Tensor out, Tensor mean, Tensor rstd, Tensor inp, Tensor weight, Tensor bias,
                       float eps) {
  const int64_t C = inp.dim(-1), N = inp.numel() / C;
  TESSERA_CHECK(out.numel() == N * C && weight.numel() == C && (bias.empty() || bias.numel() == C),
                "layernorm: inp " + shape_str(inp.shape) + ", out " + shape_str(out.shape) + ", weight " +
                    shape_str(weight.shape));
  TESSERA_CHECK((mean.empty() || mean.numel() == N) && (rstd.empty() || rstd.numel() == N),
                "layernorm: mean/rstd must have one entry per row (" + std::to_string(N) + ")");
  for (auto [t, name] : {std::pair{&out, "out"}, {&inp, "inp"}, {&weight, "weight"}, {&bias, "bias"}})
    check_float(*t, "layernorm_forward", name);
  float* m_out = f32_arg(mean, "layernorm_forward", "mean");
  float* r_out = f32_arg(rstd, "layernorm_forward", "rstd");
  Stage params(Stage::Caller);
  const float* w = params.in(weight, 0, C);
  const float* b = bias.empty() ? nullptr : params.in(bias, 0, C);
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < N; ++n) {
    Stage s;
    const float* xn = s.in(inp, n * C, C);
    // Two passes (mean, then the mean of squared deviations) rather than E[x^2] - E[x]^2,
    // which cancels catastrophically when |mean| >> std, as in a deep residual stream.
    float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
    for (int64_t c = 0; c < C; ++c) sum += xn[c];
    const float mu = sum / static_cast<float>(C);
    float sq = 0.0f;
#pragma omp simd reduction(+ : sq)
    for (int64_t c = 0; c < C; ++c) {
      const float d = xn[c] - mu;
      sq += d * d;
    }
    const float rs = 1.0f / std::sqrt(sq / static_cast<float>(C) + eps);
    float* yn = s.out(out, n * C, C);
    if (b) {
#pragma omp simd
      for (int64_t c = 0; c < C; ++c) yn[c] = (xn[c] - mu) * rs * w[c] + b[c];
    } else {
#pragma omp simd
      for (int64_t c = 0; c < C; ++c) yn[c] = (xn[c] - mu) * rs * w[c];
    }
    s.done(out, n * C, C, yn);
    if (m_out) m_out[n] = mu;
    if (r_out) r_out[n] = rs;
  }
}

void layernorm_backward(Tensor dinp, Tensor dweight, Tensor dbias, Tensor dout, Tensor inp, Tensor weight,
                        Tensor mean, Tensor rstd, GradWrite write) {
  const int64_t C = inp.dim(-1), N = inp.numel() / C;
  TESSERA_CHECK(dout.numel() == N * C && weight.numel() == C && mean.numel() == N && rstd.numel() == N,
                "layernorm backward: dout " + shape_str(dout.shape) + ", inp " + shape_str(inp.shape));
  TESSERA_CHECK((dinp.empty() || dinp.numel() == N * C) && (dweight.empty() || dweight.numel() == C) &&
                    (dbias.empty() || dbias.numel() == C),
                "layernorm backward: gradient shapes");
  for (auto [t, name] : {std::pair{&dinp, "dinp"}, {&dweight, "dweight"}, {&dbias, "dbias"}, {&dout, "dout"},
                         {&inp, "inp"}, {&weight, "weight"}})
    check_float(*t, "layernorm_backward", name);
  const float* mu = f32_arg(mean, "layernorm_backward", "mean");
  const float* rs = f32_arg(rstd, "layernorm_backward", "rstd");

  // dinp, row by row. With xhat = (x - mean) * rstd and g = dout * weight (the gradient
  // w.r.t. xhat), differentiating through mean and rstd gives
  //   dx = rstd * (g - mean(g) - xhat * mean(g * xhat)).
  if (!dinp.empty()) {
    Stage params(Stage::Caller);
    const float* w = params.in(weight, 0, C);
#pragma omp parallel for schedule(static)
    for (int64_t n = 0; n < N; ++n) {
      Stage s;
      const float* xn = s.in(inp, n * C, C);
      const float* dyn = s.in(dout, n * C, C);
      const float m = mu[n], r = rs[n];
      float g_sum = 0.0f, gx_sum = 0.0f;
#pragma omp simd reduction(+ : g_sum, gx_sum)
      for (int64_t c = 0; c < C; ++c) {
        const float g = dyn[c] * w[c];
        g_sum += g;
        gx_sum += g * ((xn[c] - m) * r);
      }
      const float g_mean = g_sum / static_cast<float>(C), gx_mean = gx_sum / static_cast<float>(C);
      float* dxn = s.grad(dinp, n * C, C, write);
#pragma omp simd
      for (int64_t c = 0; c < C; ++c) {
        const float xhat = (xn[c] - m) * r;
        dxn[c] += (dyn[c] * w[c] - g_mean - xhat * gx_mean) * r;
      }
      s.done(dinp, n * C, C, dxn);
    }
  }

  norm_affine_grads(dweight, dbias, dout, inp, mu, rs);
}

void norm_affine_grads(Tensor dweight, Tensor dbias, Tensor dout, Tensor inp, const float* mean, const float* rstd) {
  if (dweight.empty() && dbias.empty()) return;
  const int64_t C = inp.dim(-1), N = inp.numel() / C;
  // Rows are staged in groups.
  constexpr int64_t kBlock = 64, kRows = 64;
  const int64_t blocks = (C + kBlock - 1) / kBlock;
#pragma omp parallel for schedule(static)
  for (int64_t blk = 0; blk < blocks; ++blk) {
    const int64_t c0 = blk * kBlock, len = std::min(kBlock, C - c0);
    float acc_w[kBlock] = {}, acc_b[kBlock] = {};
    for (int64_t n0 = 0; n0 < N; n0 += kRows) {
      const int64_t rows = std::min(kRows, N - n0);
      Stage s;
      const Block x = s.in(inp, n0 * C + c0, rows, len, C);
      const Block dy = s.in(dout, n0 * C + c0, rows, len, C);
      for (int64_t r = 0; r < rows; ++r) {
        const float* xn = x.row(r);
        const float* dyn = dy.row(r);
        const float m = mean ? mean[n0 + r] : 0.0f, rr = rstd[n0 + r];
#pragma omp simd
        for (int64_t c = 0; c < len; ++c) {
          acc_w[c] += dyn[c] * ((xn[c] - m) * rr);
          acc_b[c] += dyn[c];
        }
      }
    }
    Stage s;
    for (auto [grad, acc] : {std::pair{&dweight, acc_w}, {&dbias, acc_b}}) {
      if (grad->empty()) continue;
      float* d = s.inout(*grad, c0, len);
      for (int64_t c = 0; c < len; ++c) d[c] += acc[c];
      s.done(*grad, c0, len, d);
    }
  }
}

}  // namespace tessera::ops::cpu
