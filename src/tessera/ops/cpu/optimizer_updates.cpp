// Element-wise optimizer updates, written op for op like PyTorch's single-tensor
// implementations (torch/optim/adamw.py, sgd.py) so that fp32 results track torch's:
// host-side scalars are computed in double (as Python does) and rounded to float once.
// Both are memory-bound (AdamW streams 7 floats per parameter), so the loops are plain
// vectorised streams split across threads.
#include <cmath>

#include "tessera/ops/cpu/cpu_ops.h"

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
  float* p = f32(param);
  const float* g = f32(grad);
  float* mm = f32(m);
  float* vv = f32(v);
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < n; ++i) {
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
}

void sgd_update(Tensor param, Tensor grad, Tensor momentum_buf, float lr, float momentum,
                float weight_decay, int64_t step, float grad_scale) {
  const int64_t n = param.numel();
  TESSERA_CHECK(grad.numel() == n, "sgd: param " + shape_str(param.shape) + ", grad " + shape_str(grad.shape));
  TESSERA_CHECK(step >= 1, "sgd: step is 1-based");
  float* p = f32(param);
  const float* g = f32(grad);
  if (momentum == 0.0f) {  // torch keeps no buffer: p -= lr * (g + wd p)
#pragma omp parallel for simd schedule(static)
    for (int64_t i = 0; i < n; ++i) p[i] = p[i] - lr * (g[i] * grad_scale + weight_decay * p[i]);
    return;
  }
  TESSERA_CHECK(momentum_buf.numel() == n, "sgd: momentum buffer " + shape_str(momentum_buf.shape));
  float* buf = f32(momentum_buf);
  // torch: d_p = g + wd p; buf = clone(d_p) on the first step, else buf = momentum buf + d_p
  // (dampening 0); p -= lr buf.
  const bool first = step == 1;
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    const float gi = g[i] * grad_scale;
    const float d = weight_decay != 0.0f ? gi + weight_decay * p[i] : gi;
    const float b = first ? d : buf[i] * momentum + d;
    buf[i] = b;
    p[i] = p[i] - lr * b;
  }
}

}  // namespace tessera::ops::cpu
