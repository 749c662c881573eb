// The per-element arithmetic of CUDA's native kernels (ops/cuda/element_math.h), compiled here
// by the host compiler, against the CPU kernels it must agree with: AdamW's step gives
// adamw_update's bits, dropout_factor gives dropout_forward's mask bit for bit, gelu_grad is
// within backend_ops_test's bound of gelu_backward (1e-6 relative to 1 + |value|), and
// swiglu_value / swiglu_grads and cross_entropy_grad within its bounds of swiglu_forward /
// swiglu_backward and cross_entropy_backward. (The kernels' launch geometry and reductions need a
// GPU: cuda.backend_ops and cuda.train_parity run them.)
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "tessera/device/device.h"
#include "tessera/ops/cuda/element_math.h"
#include "tessera/ops/ops.h"

using namespace tessera;
using tessera::ops::cuda::native::AdamwStep;
using tessera::ops::cuda::native::DropoutArgs;

namespace {

std::vector<float> random_values(size_t n, float scale, uint32_t seed) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> dist(0.0f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = dist(gen);
  return v;
}

Tensor host_tensor(std::vector<float>& v) {
  return Tensor(v.data(), DType::F32, {static_cast<int64_t>(v.size())}, &cpu_device());
}

uint32_t bits(float x) {
  uint32_t b;
  std::memcpy(&b, &x, 4);
  return b;
}

}  // namespace

TEST(CudaElementMath, AdamwStepGivesAdamwUpdatesBits) {
  const size_t n = 4096;
  const float lr = 3e-4f, beta1 = 0.9f, beta2 = 0.95f, eps = 1e-8f, wd = 0.1f, grad_scale = 0.37f;
  for (int64_t step : {1, 2, 7, 1000}) {
    std::vector<float> p = random_values(n, 1.0f, 1), g = random_values(n, 0.1f, 2);
    std::vector<float> m = random_values(n, 0.01f, 3), v = random_values(n, 0.001f, 4);
    for (float& x : v) x = std::fabs(x);
    std::vector<float> p2 = p, m2 = m, v2 = v;
    ops::adamw_update(host_tensor(p), host_tensor(g), host_tensor(m), host_tensor(v), lr, beta1, beta2, eps, wd, step,
                      grad_scale);
    float s[ops::kGradScale];
    ops::step_scalars(s, lr, wd, 1.0, beta1, beta2, step);
    // The host constants, as optimizer_updates.cpp passes them.
    const float w1 = static_cast<float>(1.0 - static_cast<double>(beta1));
    const AdamwStep adamw{s[ops::kAdamDecay], grad_scale, w1, 1.0f - w1, beta2,
                          static_cast<float>(1.0 - static_cast<double>(beta2)), s[ops::kAdamStepSize],
                          s[ops::kAdamBc2Sqrt], eps, w1 < 0.5f};
    for (size_t i = 0; i < n; ++i) {
      const float pi = adamw(p2[i], m2[i], v2[i], g[i]);
      ASSERT_EQ(bits(pi), bits(p[i])) << "step " << step << " element " << i;
      ASSERT_EQ(bits(m2[i]), bits(m[i])) << "step " << step << " element " << i;
      ASSERT_EQ(bits(v2[i]), bits(v[i])) << "step " << step << " element " << i;
    }
  }
}

TEST(CudaElementMath, DropoutFactorIsDropoutForwardsMask) {
  const int64_t B = 3, S = 1001;  // odd sizes: lanes of Philox groups cross samples and the offset
  std::vector<float> ones(static_cast<size_t>(B * S), 1.0f), out(ones.size());
  ops::Dropout dropout;
  dropout.p = 0.3f;
  dropout.key = {1234u, 17u, 5u};
  dropout.sample0 = 40;
  dropout.element_offset = 6;
  const Shape shape = {B, S};
  ops::dropout_forward(Tensor(out.data(), DType::F32, shape, &cpu_device()),
                       Tensor(ones.data(), DType::F32, shape, &cpu_device()), dropout);
  const DropoutArgs d{dropout.p,        1.0f / (1.0f - dropout.p), dropout.key.seed, dropout.key.site,
                      dropout.key.iteration, dropout.sample0,       dropout.element_offset, S};
  int64_t dropped = 0;
  for (int64_t b = 0; b < B; ++b)
    for (int64_t e = 0; e < S; ++e) {
      const float f = ops::cuda::native::dropout_factor(d, b, static_cast<uint64_t>(e));
      ASSERT_EQ(bits(f), bits(out[static_cast<size_t>(b * S + e)])) << "sample " << b << " element " << e;
      dropped += f == 0.0f;
    }
  EXPECT_GT(dropped, B * S / 5);  // the mask drops about p of the elements
  EXPECT_LT(dropped, B * S * 2 / 5);
}

TEST(CudaElementMath, GeluGradWithinTheBackendBoundOfGeluBackward) {
  std::vector<float> x = random_values(4096, 3.0f, 9), ones(x.size(), 1.0f), grad(x.size());
  for (ops::GeluKind kind : {ops::GeluKind::Tanh, ops::GeluKind::Erf}) {
    ops::gelu_backward(host_tensor(grad), host_tensor(ones), host_tensor(x), kind, ops::GradWrite::Assign);
    for (size_t i = 0; i < x.size(); ++i) {
      const float got = ops::cuda::native::gelu_grad(x[i], kind == ops::GeluKind::Erf);
      // backend_ops_test's bound for gelu_backward across backends (other exp, other order).
      EXPECT_NEAR(got, grad[i], 1e-6f * (1.0f + std::fabs(grad[i]))) << "x " << x[i];
    }
  }
}

TEST(CudaElementMath, SwigluWithinTheBackendBoundsOfTheCpuOp) {
  const size_t N = 8, F = 512;
  std::vector<float> inp = random_values(N * 2 * F, 3.0f, 11), dout = random_values(N * F, 1.0f, 12);
  std::vector<float> out(N * F), dinp(N * 2 * F);
  const Tensor in_t(inp.data(), DType::F32, {int64_t{N}, int64_t{2 * F}}, &cpu_device());
  const Tensor dinp_t(dinp.data(), DType::F32, {int64_t{N}, int64_t{2 * F}}, &cpu_device());
  const Tensor out_t(out.data(), DType::F32, {int64_t{N}, int64_t{F}}, &cpu_device());
  const Tensor dout_t(dout.data(), DType::F32, {int64_t{N}, int64_t{F}}, &cpu_device());
  ops::swiglu_forward(out_t, in_t);
  ops::swiglu_backward(dinp_t, dout_t, in_t, ops::GradWrite::Assign);
  for (size_t n = 0; n < N; ++n)
    for (size_t f = 0; f < F; ++f) {
      const float gate = inp[n * 2 * F + f], up = inp[n * 2 * F + F + f], dy = dout[n * F + f];
      const float want = out[n * F + f], want_dgate = dinp[n * 2 * F + f], want_dup = dinp[n * 2 * F + F + f];
      // backend_ops_test's bounds for swiglu across backends (other exp, other contraction).
      EXPECT_NEAR(ops::cuda::native::swiglu_value(gate, up), want, 1e-7f + 1e-6f * std::fabs(want)) << "gate " << gate;
      const ops::cuda::native::SwigluGrads g = ops::cuda::native::swiglu_grads(gate, up, dy);
      EXPECT_NEAR(g.dgate, want_dgate, 1e-6f + 1e-6f * std::fabs(want_dgate)) << "gate " << gate;
      EXPECT_NEAR(g.dup, want_dup, 1e-6f + 1e-6f * std::fabs(want_dup)) << "gate " << gate;
    }
}

TEST(CudaElementMath, CrossEntropyGradWithinTheBackendBoundOfTheCpuOp) {
  const int64_t N = 4, V = 300;
  std::vector<float> logits = random_values(static_cast<size_t>(N * V), 3.0f, 13), dlosses = random_values(N, 1.0f, 14);
  std::vector<float> lse(N), dlogits(logits.size());
  std::vector<int32_t> targets = {0, 17, 299, 150};
  for (int64_t n = 0; n < N; ++n) {  // logsumexp in double
    double sum = 0.0;
    for (int64_t v = 0; v < V; ++v) sum += std::exp(static_cast<double>(logits[static_cast<size_t>(n * V + v)]));
    lse[static_cast<size_t>(n)] = static_cast<float>(std::log(sum));
  }
  const auto t = [&](void* p, DType d, Shape s) { return Tensor(p, d, s, &cpu_device()); };
  ops::cross_entropy_backward(t(dlogits.data(), DType::F32, {N, V}), t(dlosses.data(), DType::F32, {N}),
                              t(logits.data(), DType::F32, {N, V}), t(targets.data(), DType::I32, {N}),
                              t(lse.data(), DType::F32, {N}), 0, V, ops::GradWrite::Assign);
  for (int64_t n = 0; n < N; ++n)
    for (int64_t v = 0; v < V; ++v) {
      const size_t i = static_cast<size_t>(n * V + v);
      const float got = ops::cuda::native::cross_entropy_grad(logits[i], lse[static_cast<size_t>(n)],
                                                              dlosses[static_cast<size_t>(n)], v == targets[n]);
      // backend_ops_test's bound for cross_entropy_backward (exp of the same arguments).
      EXPECT_NEAR(got, dlogits[i], 1e-6f + 1e-5f * std::fabs(dlogits[i])) << "row " << n << " column " << v;
    }
}
