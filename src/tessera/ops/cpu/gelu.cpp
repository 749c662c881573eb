// GeLU, both of Megatron's variants, with their exact derivatives.
//   Tanh (bias-gelu fusion, --openai-gelu): 0.5 x (1 + tanh(u)), u = k0 (x + k1 x^3),
//        k0 = 0.79788456 (sqrt(2/pi)), k1 = 0.044715. Computed as x * sigmoid(2u), the
//        same function (1 + tanh(u) = 2 sigmoid(2u)) with one exp and no cancellation;
//        d/dx = s + 2 x s (1 - s) u', s = sigmoid(2u), u' = k0 (1 + 3 k1 x^2).
//   Erf (torch.nn.functional.gelu): 0.5 x (1 + erf(x / sqrt 2)) = x Phi(x);
//        d/dx = Phi(x) + x phi(x), phi(x) = exp(-x^2 / 2) / sqrt(2 pi). erf is
//        erf_approx (1.5e-7 absolute, as in PyTorch's own vectorised CPU GeLU).
#include <cmath>

#include "tessera/ops/cpu/cpu_ops.h"
#include "tessera/ops/cpu/fast_math.h"

namespace tessera::ops::cpu {
namespace {

constexpr float kK0 = 0.79788456f;
constexpr float kK1 = 0.044715f;
constexpr float kInvSqrt2 = 0.70710678118654752f;
constexpr float kInvSqrt2Pi = 0.39894228040143268f;

}  // namespace

void gelu_forward(Tensor out, Tensor inp, GeluKind kind) {
  const int64_t n = inp.numel();
  TESSERA_CHECK(out.numel() == n, "gelu: out " + shape_str(out.shape) + " vs inp " + shape_str(inp.shape));
  const float* x = f32(inp);
  float* y = f32(out);
  if (kind == GeluKind::Tanh) {
#pragma omp parallel for simd schedule(static)
    for (int64_t i = 0; i < n; ++i) {
      const float xi = x[i];
      const float u = kK0 * (xi + kK1 * xi * xi * xi);
      y[i] = xi * sigmoid_approx(2.0f * u);
    }
  } else {
#pragma omp parallel for simd schedule(static)
    for (int64_t i = 0; i < n; ++i) y[i] = 0.5f * x[i] * (1.0f + erf_approx(x[i] * kInvSqrt2));
  }
}

void gelu_backward(Tensor dinp, Tensor dout, Tensor inp, GeluKind kind) {
  if (dinp.empty()) return;
  const int64_t n = inp.numel();
  TESSERA_CHECK(dinp.numel() == n && dout.numel() == n, "gelu backward: dinp " + shape_str(dinp.shape) + ", dout " +
                                                            shape_str(dout.shape) + ", inp " + shape_str(inp.shape));
  const float* x = f32(inp);
  const float* dy = f32(dout);
  float* dx = f32(dinp);
  if (kind == GeluKind::Tanh) {
#pragma omp parallel for simd schedule(static)
    for (int64_t i = 0; i < n; ++i) {
      const float xi = x[i];
      const float u = kK0 * (xi + kK1 * xi * xi * xi);
      const float du = kK0 * (1.0f + 3.0f * kK1 * xi * xi);
      const float s = sigmoid_approx(2.0f * u);
      dx[i] += dy[i] * (s + 2.0f * xi * s * (1.0f - s) * du);
    }
  } else {
#pragma omp parallel for simd schedule(static)
    for (int64_t i = 0; i < n; ++i) {
      const float xi = x[i];
      const float cdf = 0.5f * (1.0f + erf_approx(xi * kInvSqrt2));
      const float pdf = kInvSqrt2Pi * exp_approx(-0.5f * xi * xi);
      dx[i] += dy[i] * (cdf + xi * pdf);
    }
  }
}

}  // namespace tessera::ops::cpu
