// LayerNorm over the last dimension (torch.nn.LayerNorm, biased variance).
// Legend: N rows, C channels. inp, out, dout, dinp: [N,C]; weight, bias: [C]; mean, rstd: [N].
#include <algorithm>
#include <cmath>

#include "tessera/ops/cpu/cpu_ops.h"

namespace tessera::ops::cpu {

void layernorm_forward(Tensor out, Tensor mean, Tensor rstd, Tensor inp, Tensor weight, Tensor bias,
                       float eps) {
  const int64_t C = inp.dim(-1), N = inp.numel() / C;
  TESSERA_CHECK(out.numel() == N * C && weight.numel() == C && (bias.empty() || bias.numel() == C),
                "layernorm: inp " + shape_str(inp.shape) + ", out " + shape_str(out.shape) + ", weight " +
                    shape_str(weight.shape));
  TESSERA_CHECK((mean.empty() || mean.numel() == N) && (rstd.empty() || rstd.numel() == N),
                "layernorm: mean/rstd must have one entry per row (" + std::to_string(N) + ")");
  const float* x = f32(inp);
  const float* w = f32(weight);
  const float* b = bias.empty() ? nullptr : f32(bias);
  float* y = f32(out);
  float* m_out = mean.empty() ? nullptr : f32(mean);
  float* r_out = rstd.empty() ? nullptr : f32(rstd);
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < N; ++n) {
    const float* xn = x + n * C;
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
    float* yn = y + n * C;
    if (b) {
#pragma omp simd
      for (int64_t c = 0; c < C; ++c) yn[c] = (xn[c] - mu) * rs * w[c] + b[c];
    } else {
#pragma omp simd
      for (int64_t c = 0; c < C; ++c) yn[c] = (xn[c] - mu) * rs * w[c];
    }
    if (m_out) m_out[n] = mu;
    if (r_out) r_out[n] = rs;
  }
}

void layernorm_backward(Tensor dinp, Tensor dweight, Tensor dbias, Tensor dout, Tensor inp, Tensor weight,
                        Tensor mean, Tensor rstd) {
  const int64_t C = inp.dim(-1), N = inp.numel() / C;
  TESSERA_CHECK(dout.numel() == N * C && weight.numel() == C && mean.numel() == N && rstd.numel() == N,
                "layernorm backward: dout " + shape_str(dout.shape) + ", inp " + shape_str(inp.shape));
  TESSERA_CHECK((dinp.empty() || dinp.numel() == N * C) && (dweight.empty() || dweight.numel() == C) &&
                    (dbias.empty() || dbias.numel() == C),
                "layernorm backward: gradient shapes");
  const float* x = f32(inp);
  const float* w = f32(weight);
  const float* dy = f32(dout);
  const float* mu = f32(mean);
  const float* rs = f32(rstd);

  // dinp, row by row. With xhat = (x - mean) * rstd and g = dout * weight (the gradient
  // w.r.t. xhat), differentiating through mean and rstd gives
  //   dx = rstd * (g - mean(g) - xhat * mean(g * xhat)).
  if (!dinp.empty()) {
    float* dx = f32(dinp);
#pragma omp parallel for schedule(static)
    for (int64_t n = 0; n < N; ++n) {
      const float* xn = x + n * C;
      const float* dyn = dy + n * C;
      const float m = mu[n], r = rs[n];
      float g_sum = 0.0f, gx_sum = 0.0f;
#pragma omp simd reduction(+ : g_sum, gx_sum)
      for (int64_t c = 0; c < C; ++c) {
        const float g = dyn[c] * w[c];
        g_sum += g;
        gx_sum += g * ((xn[c] - m) * r);
      }
      const float g_mean = g_sum / static_cast<float>(C), gx_mean = gx_sum / static_cast<float>(C);
      float* dxn = dx + n * C;
#pragma omp simd
      for (int64_t c = 0; c < C; ++c) {
        const float xhat = (xn[c] - m) * r;
        dxn[c] += (dyn[c] * w[c] - g_mean - xhat * gx_mean) * r;
      }
    }
  }

  // dweight = sum over rows of dout * xhat, dbias = sum of dout: a reduction over rows, so
  // threads split the channels (each owns a column block and sums its rows in order): no
  // atomics, and the same bits for any thread count.
  if (dweight.empty() && dbias.empty()) return;
  float* dw = dweight.empty() ? nullptr : f32(dweight);
  float* db = dbias.empty() ? nullptr : f32(dbias);
  constexpr int64_t kBlock = 64;
  const int64_t blocks = (C + kBlock - 1) / kBlock;
#pragma omp parallel for schedule(static)
  for (int64_t blk = 0; blk < blocks; ++blk) {
    const int64_t c0 = blk * kBlock, len = std::min(kBlock, C - c0);
    float acc_w[kBlock] = {}, acc_b[kBlock] = {};
    for (int64_t n = 0; n < N; ++n) {
      const float* xn = x + n * C + c0;
      const float* dyn = dy + n * C + c0;
      const float m = mu[n], r = rs[n];
#pragma omp simd
      for (int64_t c = 0; c < len; ++c) {
        acc_w[c] += dyn[c] * ((xn[c] - m) * r);
        acc_b[c] += dyn[c];
      }
    }
    for (int64_t c = 0; c < len; ++c) {
      if (dw) dw[c0 + c] += acc_w[c];
      if (db) db[c0 + c] += acc_b[c];
    }
  }
}

}  // namespace tessera::ops::cpu
