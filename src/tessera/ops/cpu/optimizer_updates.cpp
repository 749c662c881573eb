// Element-wise optimizer updates (param and state f32, the gradient any float dtype,
// staged in chunks: storage.h), written op for op like PyTorch's single-tensor implementations (torch/optim/adamw.py, sgd.py) so that fp32 results track torch's:
// host-side scalars are computed in double (as Python does) and rounded to float once.
// Both are memory-bound (AdamW streams 7 floats per parameter), so the loops are plain
// vectorised streams split across threads.
#include <cmath>

#include "tessera/ops/cpu/cpu_ops.h"
#include "tessera/ops/cpu/storage.h"

namespace tessera::ops::cpu {

void adamw_update(Tensor param, Tensor grad, Tensor m, Tensor v, float lr, float beta1, float beta2,
                  float eps, float weight_decay, int64_t step, float grad_scale) {
  const int64_t n = param.numel();
  TESSERA_CHECK(grad.numel() == n && m.numel() == n && v.numel() == n,
                "adamw: param " + shape_str(param.shape) + ", grad " + shape_str(grad.shape) + ", m " +
                    shape_str(m.shape) + ", v " + shape_str(v.shape));
  TESSERA_CHECK(step >= 1, "adamw: step is 1-based");
  // torch: param.mul_(1 - lr * weight_decay)
  const float decay = static_cast<float>(1.0 - static_cast<double>(lr) * weight_decay);
  // torch: exp_avg.lerp_(grad, 1 - beta1); ATen's lerp is a + w (b - a) for w < 0.5,
  // b - (b - a)(1 - w) otherwise.
  const float w1 = static_cast<float>(1.0 - static_cast<double>(beta1));
  const bool lerp_low = w1 < 0.5f;
  const float w1c = 1.0f - w1;
  // torch: exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
  const float w2 = static_cast<float>(1.0 - static_cast<double>(beta2));
  // torch: step_size = lr / (1 - beta1^t); denom = sqrt(v) / sqrt(1 - beta2^t) + eps
  const double bc1 = 1.0 - std::pow(static_cast<double>(beta1), static_cast<double>(step));
  const double bc2 = 1.0 - std::pow(static_cast<double>(beta2), static_cast<double>(step));
  const float step_size = static_cast<float>(lr / bc1);
  const float bc2_sqrt = static_cast<float>(std::sqrt(bc2));
  float* param0 = f32_arg(param, "adamw_update", "param");
  float* m0 = f32_arg(m, "adamw_update", "m");
  float* v0 = f32_arg(v, "adamw_update", "v");
  check_float(grad, "adamw_update", "grad");
  for_chunks(n, [&](int64_t off, int64_t len) {
    Stage s;
    const float* g = s.in(grad, off, len);
    float *p = param0 + off, *mm = m0 + off, *vv = v0 + off;
#pragma omp simd
    for (int64_t i = 0; i < len; ++i) {
      const float gi = g[i] * grad_scale;  // exact when grad_scale == 1
      float pi = p[i] * decay;
      const float mi = lerp_low ? mm[i] + w1 * (gi - mm[i]) : gi - (gi - mm[i]) * w1c;
      const float vi = vv[i] * beta2 + w2 * (gi * gi);
      const float denom = std::sqrt(vi) / bc2_sqrt + eps;
      pi = pi - step_size * (mi / denom);
      p[i] = pi;
      mm[i] = mi;
      vv[i] = vi;
    }
  });
}

void sgd_update(Tensor param, Tensor grad, Tensor momentum_buf, float lr, float momentum,
                float weight_decay, int64_t step, float grad_scale) {
  const int64_t n = param.numel();
  TESSERA_CHECK(grad.numel() == n, "sgd: param " + shape_str(param.shape) + ", grad " + shape_str(grad.shape));
  TESSERA_CHECK(step >= 1, "sgd: step is 1-based");
  float* param0 = f32_arg(param, "sgd_update", "param");
  float* buf0 = momentum == 0.0f ? nullptr : f32_arg(momentum_buf, "sgd_update", "momentum_buf");
  check_float(grad, "sgd_update", "grad");
  if (momentum != 0.0f)
    TESSERA_CHECK(buf0 && momentum_buf.numel() == n, "sgd: momentum buffer " + shape_str(momentum_buf.shape));
  // torch: d_p = g + wd p; without momentum p -= lr d_p (torch keeps no buffer); with it
  // buf = clone(d_p) on the first step, else buf = momentum buf + d_p (dampening 0), and
  // p -= lr buf.
  const bool first = step == 1;
  for_chunks(n, [&](int64_t off, int64_t len) {
    Stage s;
    const float* g = s.in(grad, off, len);
    float* p = param0 + off;
    if (!buf0) {
#pragma omp simd
      for (int64_t i = 0; i < len; ++i) p[i] = p[i] - lr * (g[i] * grad_scale + weight_decay * p[i]);
      return;
    }
    float* buf = buf0 + off;
#pragma omp simd
    for (int64_t i = 0; i < len; ++i) {
      const float gi = g[i] * grad_scale;
      const float d = weight_decay != 0.0f ? gi + weight_decay * p[i] : gi;
      const float b = first ? d : buf[i] * momentum + d;
      buf[i] = b;
      p[i] = p[i] - lr * b;
    }
  });
}

}  // namespace tessera::ops::cpu
