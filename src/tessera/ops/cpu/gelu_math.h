// GeLU's value and derivative at one f32 element, both of Megatron's variants (ops.h
// GeluKind): the arithmetic of gelu.cpp and of the fused linear + bias + GeLU
// (epilogue.cpp), inline so their loops vectorise.
//   Tanh (bias-gelu fusion, --openai-gelu): 0.5 x (1 + tanh(u)), u = k0 (x + k1 x^3),
//        k0 = 0.79788456 (sqrt(2/pi)), k1 = 0.044715. Computed as x * sigmoid(2u), the
//        same function (1 + tanh(u) = 2 sigmoid(2u)) with one exp and no cancellation;
//        d/dx = s + 2 x s (1 - s) u', s = sigmoid(2u), u' = k0 (1 + 3 k1 x^2).
//   Erf (torch.nn.functional.gelu): 0.5 x (1 + erf(x / sqrt 2)) = x Phi(x);
//        d/dx = Phi(x) + x phi(x), phi(x) = exp(-x^2 / 2) / sqrt(2 pi). erf is
//        erf_approx (1.5e-7 absolute, as in PyTorch's own vectorised CPU GeLU).
#pragma once

#include "tessera/ops/cpu/fast_math.h"

namespace tessera::ops::cpu {

inline constexpr float kGeluK0 = 0.79788456f;
inline constexpr float kGeluK1 = 0.044715f;
inline constexpr float kInvSqrt2 = 0.70710678118654752f;
inline constexpr float kInvSqrt2Pi = 0.39894228040143268f;

inline float gelu_tanh(float x) {
  const float u = kGeluK0 * (x + kGeluK1 * x * x * x);
  return x * sigmoid_approx(2.0f * u);
}

inline float gelu_erf(float x) { return 0.5f * x * (1.0f + erf_approx(x * kInvSqrt2)); }

inline float gelu_tanh_grad(float x) {
  const float u = kGeluK0 * (x + kGeluK1 * x * x * x);
  const float du = kGeluK0 * (1.0f + 3.0f * kGeluK1 * x * x);
  const float sg = sigmoid_approx(2.0f * u);
  return sg + 2.0f * x * sg * (1.0f - sg) * du;
}

inline float gelu_erf_grad(float x) {
  const float cdf = 0.5f * (1.0f + erf_approx(x * kInvSqrt2));
  const float pdf = kInvSqrt2Pi * exp_approx(-0.5f * x * x);
  return cdf + x * pdf;
}

}  // namespace tessera::ops::cpu
