// GeLU, both of Megatron's variants, with their exact derivatives. Tensors of any float
// dtype, staged in chunks (storage.h).
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
#include "tessera/ops/cpu/storage.h"

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
  check_float(out, "gelu_forward", "out");
  check_float(inp, "gelu_forward", "inp");
  for_chunks(n, [&](int64_t off, int64_t len) {
    Stage s;
    const float* x = s.in(inp, off, len);
    float* y = s.out(out, off, len);
    if (kind == GeluKind::Tanh) {
#pragma omp simd
      for (int64_t i = 0; i < len; ++i) {
        const float xi = x[i];
        const float u = kK0 * (xi + kK1 * xi * xi * xi);
        y[i] = xi * sigmoid_approx(2.0f * u);
      }
    } else {
#pragma omp simd
      for (int64_t i = 0; i < len; ++i) y[i] = 0.5f * x[i] * (1.0f + erf_approx(x[i] * kInvSqrt2));
    }
    s.done(out, off, len, y);
  });
}

void gelu_backward(Tensor dinp, Tensor dout, Tensor inp, GeluKind kind) {
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
    float* dx = s.inout(dinp, off, len);
    if (kind == GeluKind::Tanh) {
#pragma omp simd
      for (int64_t i = 0; i < len; ++i) {
        const float xi = x[i];
        const float u = kK0 * (xi + kK1 * xi * xi * xi);
        const float du = kK0 * (1.0f + 3.0f * kK1 * xi * xi);
        const float sg = sigmoid_approx(2.0f * u);
        dx[i] += dy[i] * (sg + 2.0f * xi * sg * (1.0f - sg) * du);
      }
    } else {
#pragma omp simd
      for (int64_t i = 0; i < len; ++i) {
        const float xi = x[i];
        const float cdf = 0.5f * (1.0f + erf_approx(xi * kInvSqrt2));
        const float pdf = kInvSqrt2Pi * exp_approx(-0.5f * xi * xi);
        dx[i] += dy[i] * (cdf + xi * pdf);
      }
    }
    s.done(dinp, off, len, dx);
  });
}

}  // namespace tessera::ops::cpu
