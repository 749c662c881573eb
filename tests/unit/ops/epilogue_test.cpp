// The fused epilogues of ops.h (linear + bias + GeLU, bias + dropout + residual add), the
// in-place cross-entropy gradient and GradWrite::Assign, on every backend this binary was
// built with (the CPU, the strict device, each OpenCL and CUDA device):
// - each fused op's forward against a float64 reference within its ops.h bound, and its
//   backward against central differences of its own forward;
// - fused against unfused within the same bounds, in f32 and bf16;
// - the fused dropout's mask is dropout_forward's: the same elements are zero;
// - Assign writes the bits of Accumulate into zeros without reading its output (which
//   holds NaN here, so a kernel that reads it, or a GEMM that scales it by beta = 0, fails);
// - the cross-entropy gradient written over the logits equals the one written elsewhere.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "tessera/core/dtype.h"
#include "host_values.h"
#include "tessera/core/tensor.h"
#include "tessera/device/device.h"
#include "tessera/device/registry.h"
#include "tessera/ops/ops.h"

using namespace tessera;

namespace {

using Host = std::vector<float>;
constexpr ops::GradWrite kAssign = ops::GradWrite::Assign;
constexpr ops::GradWrite kAccumulate = ops::GradWrite::Accumulate;

std::vector<std::string> backends() {
  std::vector<std::string> specs = {"cpu", "strict"};
  for (const std::string& backend : device_backends()) {
    if (backend == "cpu") continue;
    for (int i = 0; i < device_count(backend); ++i) specs.push_back(backend + ":" + std::to_string(i));
  }
  return specs;
}

ops::Dropout dropout_of(float p, uint32_t site, uint64_t element_offset) {
  ops::Dropout d;
  d.p = p;
  d.key = {.seed = 42, .iteration = 3, .site = site};
  d.sample0 = 5;
  d.element_offset = element_offset;
  return d;
}

// GeLU in float64, the exact functions (tanh form and erf form) and their derivatives.
double gelu64(double x, ops::GeluKind kind) {
  if (kind == ops::GeluKind::Erf) return 0.5 * x * (1.0 + std::erf(x / std::sqrt(2.0)));
  const double k0 = std::sqrt(2.0 / M_PI);
  return 0.5 * x * (1.0 + std::tanh(k0 * (x + 0.044715 * x * x * x)));
}

class Epilogue : public ::testing::TestWithParam<std::string> {
 protected:
  Device& device() { return open_device(GetParam()); }

  Tensor upload(const Shape& shape, const Host& v, DType dtype = DType::F32) {
    buffers_.emplace_back(device(), static_cast<size_t>(shape_numel(shape)) * dtype_size(dtype));
    Tensor t = tensor_at(buffers_.back(), 0, dtype, shape);
    if (dtype == DType::F32) {
      copy_from_host(t, v.data(), t.bytes());
    } else {
      std::vector<uint16_t> h(v.size());
      for (size_t i = 0; i < v.size(); ++i) h[i] = dtype == DType::BF16 ? f32_to_bf16(v[i]) : f32_to_f16(v[i]);
      copy_from_host(t, h.data(), t.bytes());
    }
    return t;
  }
  Host normal_values(int64_t n, float std = 1.0f) {
    std::normal_distribution<float> dist(0.0f, std);
    Host v(static_cast<size_t>(n));
    for (float& x : v) x = dist(gen_);
    return v;
  }
  Tensor normal(const Shape& shape, float std = 1.0f, DType dtype = DType::F32) {
    return upload(shape, normal_values(shape_numel(shape), std), dtype);
  }
  Tensor filled(const Shape& shape, float value, DType dtype = DType::F32) {
    return upload(shape, Host(static_cast<size_t>(shape_numel(shape)), value), dtype);
  }
  Tensor nans(const Shape& shape, DType dtype = DType::F32) {
    return filled(shape, std::numeric_limits<float>::quiet_NaN(), dtype);
  }
  static Host read(const Tensor& t) { return testing_support::host_values(t); }
  static std::vector<uint8_t> bytes(const Tensor& t) {
    std::vector<uint8_t> v(t.bytes());
    copy_to_host(v.data(), v.size(), t);
    return v;
  }
  // Every |got - want| <= bound[i]; reports the worst element.
  void expect_within(const char* what, const Host& got, const std::vector<double>& want,
                     const std::vector<double>& bound) {
    ASSERT_EQ(got.size(), want.size());
    size_t bad = 0, worst = 0;
    double worst_excess = -1.0;
    for (size_t i = 0; i < got.size(); ++i) {
      const double excess = std::fabs(got[i] - want[i]) - bound[i];
      if (!(excess <= 0.0)) ++bad;
      if (!(excess <= worst_excess)) worst_excess = excess, worst = i;
    }
    EXPECT_EQ(bad, 0u) << what << " on " << GetParam() << ": " << bad << " of " << got.size()
                       << " beyond the bound; worst at " << worst << ": got " << got[worst] << ", want "
                       << want[worst] << ", bound " << bound[worst];
  }
  void expect_close(const char* what, const Host& got, const Host& want, double rel, double abs) {
    std::vector<double> w(want.begin(), want.end()), b(want.size());
    for (size_t i = 0; i < b.size(); ++i) b[i] = abs + rel * std::fabs(want[i]);
    expect_within(what, got, w, b);
  }
  // Central differences of loss() w.r.t. each element of the host values x (which loss()
  // uploads), against the analytic gradient.
  void expect_gradient(const char* what, Host& x, const Host& analytic, const std::function<double()>& loss,
                       float eps, double atol, double rtol) {
    double largest = 0.0;
    for (size_t i = 0; i < x.size(); ++i) {
      const float orig = x[i], up = orig + eps, down = orig - eps;
      x[i] = up;
      const double lp = loss();
      x[i] = down;
      const double lm = loss();
      x[i] = orig;
      const double num = (lp - lm) / (static_cast<double>(up) - down);
      largest = std::max(largest, std::fabs(num));
      EXPECT_LE(std::fabs(num - analytic[i]), atol + rtol * std::fabs(num))
          << what << " element " << i << " on " << GetParam() << ": numeric " << num << ", analytic " << analytic[i];
    }
    EXPECT_GT(largest, 10 * atol) << what << ": gradient too small for the check to mean anything";
  }
  // Runs backward(grad, write) with Accumulate into zeros and with Assign into NaNs: the same
  // bits, so Assign read nothing and added to 0.
  void check_assign(const char* what, const Shape& shape, DType dtype,
                    const std::function<void(const Tensor&, ops::GradWrite)>& backward) {
    const Tensor accumulated = filled(shape, 0.0f, dtype), assigned = nans(shape, dtype);
    backward(accumulated, kAccumulate);
    backward(assigned, kAssign);
    EXPECT_EQ(bytes(assigned), bytes(accumulated)) << what << " (" << dtype_name(dtype) << ") on " << GetParam();
  }
  static double weighted_sum(const Host& out, const Host& R) {
    double s = 0.0;
    for (size_t i = 0; i < out.size(); ++i) s += static_cast<double>(out[i]) * R[i];
    return s;
  }

  std::mt19937 gen_{2026};
  std::vector<Buffer> buffers_;
};

// ---- linear + bias + GeLU --------------------------------------------------------------

// pre = x @ w^T + b and gelu(pre) in float64, with ops.h's bound on pre ((C+1) 2^-24 (|b| +
// sum |x w|)) and on out (gelu' <= 1.13 times pre's bound, plus the GeLU approximations'
// few f32 ulps: erf_approx's 1.5e-7 absolute, exp_approx's 2 ulp).
struct GeluReference {
  std::vector<double> pre, out, pre_bound, out_bound;
};
GeluReference linear_gelu64(const Host& x, const Host& w, const Host& b, int64_t N, int64_t C, int64_t OC,
                            ops::GeluKind kind) {
  GeluReference r;
  for (int64_t n = 0; n < N; ++n)
    for (int64_t o = 0; o < OC; ++o) {
      double p = b.empty() ? 0.0 : b[o], mag = b.empty() ? 0.0 : std::fabs(b[o]);
      for (int64_t c = 0; c < C; ++c) {
        p += static_cast<double>(x[n * C + c]) * w[o * C + c];
        mag += std::fabs(static_cast<double>(x[n * C + c]) * w[o * C + c]);
      }
      const double g = gelu64(p, kind);
      r.pre.push_back(p);
      r.out.push_back(g);
      const double bound = static_cast<double>(C + 1) * 0x1p-24 * mag;
      r.pre_bound.push_back(bound);
      r.out_bound.push_back(1.13 * bound + 1e-6 + 1e-6 * std::fabs(g));
    }
  return r;
}

TEST_P(Epilogue, LinearBiasGeluForwardMatchesFloat64) {
  // 37 rows, 70 columns: more than one 64-column block and odd sizes everywhere.
  const int64_t N = 37, C = 19, OC = 70;
  for (ops::GeluKind kind : {ops::GeluKind::Tanh, ops::GeluKind::Erf})
    for (bool with_bias : {true, false}) {
      SCOPED_TRACE(std::string(kind == ops::GeluKind::Tanh ? "tanh" : "erf") + (with_bias ? ", bias" : ", no bias"));
      const Host x = normal_values(N * C), w = normal_values(OC * C, 0.5f), b = with_bias ? normal_values(OC) : Host();
      const Tensor out = nans({N, OC}), pre = nans({N, OC});
      ops::linear_bias_gelu_forward(out, pre, upload({N, C}, x), upload({OC, C}, w),
                                    with_bias ? upload({OC}, b) : Tensor(), kind);
      const GeluReference ref = linear_gelu64(x, w, b, N, C, OC, kind);
      expect_within("pre", read(pre), ref.pre, ref.pre_bound);
      expect_within("out", read(out), ref.out, ref.out_bound);
    }
}

TEST_P(Epilogue, LinearBiasGeluBackwardMatchesFiniteDifferences) {
  const int64_t N = 3, C = 4, OC = 5;
  for (ops::GeluKind kind : {ops::GeluKind::Tanh, ops::GeluKind::Erf}) {
    SCOPED_TRACE(kind == ops::GeluKind::Tanh ? "tanh" : "erf");
    Host x = normal_values(N * C), w = normal_values(OC * C, 0.5f), b = normal_values(OC);
    const Host R = normal_values(N * OC);
    auto loss = [&] {
      const Tensor out = nans({N, OC}), pre = nans({N, OC});
      ops::linear_bias_gelu_forward(out, pre, upload({N, C}, x), upload({OC, C}, w), upload({OC}, b), kind);
      return weighted_sum(read(out), R);
    };
    // The analytic gradients, accumulated onto prefilled buffers (parameters, and dinp
    // with Accumulate); dpre is a workspace, here dout itself.
    const Tensor out = nans({N, OC}), pre = nans({N, OC}), inp = upload({N, C}, x), weight = upload({OC, C}, w);
    ops::linear_bias_gelu_forward(out, pre, inp, weight, upload({OC}, b), kind);
    const Host px = normal_values(N * C), pw = normal_values(OC * C), pb = normal_values(OC);
    const Tensor dinp = upload({N, C}, px), dweight = upload({OC, C}, pw), dbias = upload({OC}, pb);
    const Tensor dout = upload({N, OC}, R);
    ops::linear_bias_gelu_backward(dinp, dweight, dbias, dout, dout, inp, weight, pre, kind, kAccumulate);
    auto minus = [](Host a, const Host& prefill) {
      for (size_t i = 0; i < a.size(); ++i) a[i] -= prefill[i];
      return a;
    };
    // Smooth in every input: eps = 1e-3 truncates ~1e-7; the f32 rounding of the ~5 outputs
    // a perturbation moves (|out| <= ~4, 2.4e-7 each) over 2 eps is ~1e-3 at worst.
    // atol and rtol 2e-3; a wrong term (the bias gradient, a missing gelu') is off by O(0.1).
    expect_gradient("dinp", x, minus(read(dinp), px), loss, 1e-3f, 2e-3, 2e-3);
    expect_gradient("dweight", w, minus(read(dweight), pw), loss, 1e-3f, 2e-3, 2e-3);
    expect_gradient("dbias", b, minus(read(dbias), pb), loss, 1e-3f, 2e-3, 2e-3);
  }
}

TEST_P(Epilogue, LinearBiasGeluMatchesUnfusedOps) {
  const int64_t N = 37, C = 19, OC = 70;
  for (DType dtype : {DType::F32, DType::BF16}) {
    SCOPED_TRACE(dtype_name(dtype));
    const ops::GeluKind kind = ops::GeluKind::Tanh;
    const Host x = normal_values(N * C), w = normal_values(OC * C, 0.5f), b = normal_values(OC);
    const Tensor inp = upload({N, C}, x, dtype), weight = upload({OC, C}, w, dtype), bias = upload({OC}, b, dtype);
    const Tensor out = nans({N, OC}, dtype), pre = nans({N, OC}, dtype);
    const Tensor out_u = nans({N, OC}, dtype), pre_u = nans({N, OC}, dtype);
    ops::linear_bias_gelu_forward(out, pre, inp, weight, bias, kind);
    ops::linear_forward(pre_u, inp, weight, bias);
    ops::gelu_forward(out_u, pre_u, kind);
    // f32: both within ops.h's bound of float64, so of each other within twice it (here
    // 2 * 20 * 2^-24 * (|b| + sum |x w|) <= 2.4e-6 * ~10). bf16: a device adds the bias
    // after the GEMM's rounding, so pre may round twice and out's GeLU then sees another
    // input: two bf16 ulps (2^-6 relative), and 2^-5 absolute near 0.
    const double rel = dtype == DType::F32 ? 2e-6 : 0x1p-6, abs = dtype == DType::F32 ? 1e-4 : 0x1p-5;
    expect_close("pre", read(pre), read(pre_u), rel, abs);
    expect_close("out", read(out), read(out_u), rel, abs);
    // The backward: the fused op's dgelu + bias gradient + GEMMs against gelu_backward,
    // bias_add's column sums and linear_backward.
    const Host dy = normal_values(N * OC);
    const Tensor dout = upload({N, OC}, dy, dtype), dpre = nans({N, OC}, dtype);
    const Tensor dinp = nans({N, C}, dtype), dweight = filled({OC, C}, 0.0f), dbias = filled({OC}, 0.0f);
    ops::linear_bias_gelu_backward(dinp, dweight, dbias, dpre, dout, inp, weight, pre_u, kind, kAssign);
    const Tensor dpre_u = nans({N, OC}, dtype), dinp_u = nans({N, C}, dtype);
    const Tensor dweight_u = filled({OC, C}, 0.0f), dbias_u = filled({OC}, 0.0f);
    ops::gelu_backward(dpre_u, dout, pre_u, kind, kAssign);
    ops::linear_backward(dinp_u, dweight_u, dbias_u, dpre_u, inp, weight, kAssign);
    // The same products and sums but for the bias gradient, which the fused op sums before
    // rounding dpre (bf16: up to 2^-8 of each term): sums of 37 terms of ~1.
    expect_close("dpre", read(dpre), read(dpre_u), dtype == DType::F32 ? 1e-6 : 0x1p-7, 1e-6);
    expect_close("dinp", read(dinp), read(dinp_u), dtype == DType::F32 ? 1e-5 : 0x1p-7, 1e-4);
    expect_close("dweight", read(dweight), read(dweight_u), 1e-5, dtype == DType::F32 ? 1e-4 : 0.1);
    expect_close("dbias", read(dbias), read(dbias_u), 1e-5, dtype == DType::F32 ? 1e-4 : 0.1);
  }
}

// ---- bias + dropout + residual add -----------------------------------------------------

TEST_P(Epilogue, BiasDropoutAddDropsDropoutForwardsElementsAndMatchesFloat64) {
  // [B, T, C] with C = 70 (two column blocks) and an element offset that is not a multiple
  // of 4, so rows and shards start mid-way through a Philox group.
  const int64_t B = 3, T = 5, C = 70, n = B * T * C;
  for (float p : {0.3f, 0.0f}) {
    SCOPED_TRACE("p " + std::to_string(p));
    const ops::Dropout drop = dropout_of(p, 9, 6);
    // The factors (0 or 1/(1-p)) of dropout_forward's mask, read from a tensor of ones.
    const Tensor ones = filled({B, T, C}, 1.0f), factors = nans({B, T, C});
    ops::dropout_forward(factors, ones, drop);
    const Host f = read(factors);
    const Host x = normal_values(n), b = normal_values(C), r = normal_values(n);
    const Tensor out = nans({B, T, C});
    ops::bias_dropout_add_forward(out, upload({B, T, C}, x), upload({C}, b), upload({B, T, C}, r), drop);
    const Host got = read(out);
    // With a zero residual, exactly the elements dropout_forward drops are 0.
    const Tensor masked = nans({B, T, C});
    ops::bias_dropout_add_forward(masked, upload({B, T, C}, x), upload({C}, b), filled({B, T, C}, 0.0f), drop);
    const Host m = read(masked);
    int64_t dropped = 0;
    for (int64_t i = 0; i < n; ++i) {
      EXPECT_EQ(m[i] == 0.0f, f[i] == 0.0f) << "element " << i << " on " << GetParam();
      dropped += f[i] == 0.0f;
    }
    if (p > 0) {
      EXPECT_GT(dropped, n / 5) << "the mask drops about p of the elements";
    }
    // Float64: out = r + (x + b) f within 2^-22 (|r| + |(x + b) f|) (ops.h).
    std::vector<double> want(n), bound(n);
    for (int64_t i = 0; i < n; ++i) {
      const double t = (static_cast<double>(x[i]) + b[i % C]) * f[i];
      want[i] = r[i] + t;
      bound[i] = 0x1p-22 * (std::fabs(r[i]) + std::fabs(t));
    }
    expect_within("out", got, want, bound);
    // The backward against float64: dinp = dout f, dbias = its column sums (any order:
    // within N * 2^-24 * sum |terms|), dresidual = dout.
    const Host dy = normal_values(n);
    const Tensor dout = upload({B, T, C}, dy), dinp = nans({B, T, C}), dres = nans({B, T, C});
    const Tensor dbias = filled({C}, 0.0f);
    ops::bias_dropout_add_backward(dinp, dbias, dres, dout, drop, kAssign);
    std::vector<double> dx(n), dx_bound(n, 0.0), db(C, 0.0), db_bound(C, 0.0), dr(dy.begin(), dy.end());
    for (int64_t i = 0; i < n; ++i) {
      dx[i] = static_cast<double>(dy[i]) * f[i];
      dx_bound[i] = 0x1p-24 * std::fabs(dx[i]);
      db[i % C] += dx[i];
      db_bound[i % C] += B * T * 0x1p-23 * std::fabs(dx[i]);
    }
    expect_within("dinp", read(dinp), dx, dx_bound);
    expect_within("dresidual", read(dres), dr, std::vector<double>(n, 0.0));
    expect_within("dbias", read(dbias), db, db_bound);
  }
}

TEST_P(Epilogue, BiasDropoutAddBackwardMatchesFiniteDifferences) {
  const int64_t B = 2, T = 3, C = 5, n = B * T * C;
  const ops::Dropout drop = dropout_of(0.4f, 2, 3);
  Host x = normal_values(n), b = normal_values(C), r = normal_values(n);
  const Host R = normal_values(n);
  auto loss = [&] {
    const Tensor out = nans({B, T, C});
    ops::bias_dropout_add_forward(out, upload({B, T, C}, x), upload({C}, b), upload({B, T, C}, r), drop);
    return weighted_sum(read(out), R);
  };
  const Host px = normal_values(n), pb = normal_values(C), pr = normal_values(n);
  const Tensor dinp = upload({B, T, C}, px), dbias = upload({C}, pb), dres = upload({B, T, C}, pr);
  ops::bias_dropout_add_backward(dinp, dbias, dres, upload({B, T, C}, R), drop, kAccumulate);
  auto minus = [](Host a, const Host& prefill) {
    for (size_t i = 0; i < a.size(); ++i) a[i] -= prefill[i];
    return a;
  };
  // Linear in every input: central differences are exact up to the rounding of the
  // outputs one element moves (~2.4e-7 * ~4 each, 6 for a bias) over 0.2: ~3e-5. atol 1e-4.
  expect_gradient("dinp", x, minus(read(dinp), px), loss, 0.1f, 1e-4, 1e-4);
  expect_gradient("dbias", b, minus(read(dbias), pb), loss, 0.1f, 1e-4, 1e-4);
  expect_gradient("dresidual", r, minus(read(dres), pr), loss, 0.1f, 1e-4, 1e-4);
}

TEST_P(Epilogue, BiasDropoutAddMatchesUnfusedOps) {
  const int64_t B = 3, T = 5, C = 70;
  const ops::Dropout drop = dropout_of(0.3f, 9, 6);
  for (DType dtype : {DType::F32, DType::BF16}) {
    SCOPED_TRACE(dtype_name(dtype));
    const Tensor x = normal({B, T, C}, 1.0f, dtype), bias = normal({C}, 1.0f, dtype), r = normal({B, T, C}, 1.0f, dtype);
    const Tensor out = nans({B, T, C}, dtype), tmp = nans({B, T, C}, dtype), out_u = nans({B, T, C}, dtype);
    ops::bias_dropout_add_forward(out, x, bias, r, drop);
    ops::bias_add_forward(tmp, x, bias);
    ops::dropout_forward(tmp, tmp, drop);
    ops::residual_forward(out_u, r, tmp);
    // f32: each within 2^-22 of float64's relative scale (|r| + |x + b| / (1-p) <= ~10):
    // 1e-5 absolute. bf16: the unfused ops round after each of three steps, the fused op
    // once: a few bf16 ulps.
    const double rel = dtype == DType::F32 ? 1e-6 : 0x1p-6, abs = dtype == DType::F32 ? 1e-5 : 0x1p-5;
    expect_close("out", read(out), read(out_u), rel, abs);
    const Tensor dout = normal({B, T, C}, 1.0f, dtype), dinp = nans({B, T, C}, dtype), dinp_u = nans({B, T, C}, dtype);
    const Tensor dbias = filled({C}, 0.0f), dbias_u = filled({C}, 0.0f);
    ops::bias_dropout_add_backward(dinp, dbias, Tensor(), dout, drop, kAssign);
    ops::dropout_backward(dinp_u, dout, drop, kAssign);
    ops::bias_add_backward(dbias_u, dinp_u);
    // The same products (dinp exact); the bias gradient sums the same values in the same
    // order in f32 (bf16: the fused op sums them before dinp's rounding).
    expect_close("dinp", read(dinp), read(dinp_u), 0.0, 0.0);
    expect_close("dbias", read(dbias), read(dbias_u), dtype == DType::F32 ? 0.0 : 0x1p-7, dtype == DType::F32 ? 0.0 : 0.1);
  }
}

// ---- GradWrite::Assign and the in-place cross-entropy --------------------------------------

TEST_P(Epilogue, AssignGivesTheBitsOfAccumulatingIntoZeros) {
  const int64_t N = 37, C = 19, OC = 70;
  for (DType dtype : {DType::F32, DType::BF16}) {
    const Tensor x = normal({N, C}, 1.0f, dtype), w = normal({OC, C}, 1.0f, dtype), dy = normal({N, OC}, 1.0f, dtype);
    const Tensor dw = filled({OC, C}, 0.0f);
    check_assign("linear dinp", {N, C}, dtype, [&](const Tensor& g, ops::GradWrite m) {
      ops::linear_backward(g, dw, Tensor(), dy, x, w, m);
    });
    const Tensor pre = normal({N, OC}, 2.0f, dtype);
    for (ops::GeluKind kind : {ops::GeluKind::Tanh, ops::GeluKind::Erf}) {
      check_assign("gelu dinp", {N, OC}, dtype,
                   [&](const Tensor& g, ops::GradWrite m) { ops::gelu_backward(g, dy, pre, kind, m); });
      check_assign("linear_bias_gelu dinp", {N, C}, dtype, [&](const Tensor& g, ops::GradWrite m) {
        ops::linear_bias_gelu_backward(g, Tensor(), Tensor(), nans({N, OC}, dtype), dy, x, w, pre, kind, m);
      });
    }
    const Tensor gu = normal({N, 2 * C}, 2.0f, dtype), dyc = normal({N, C}, 1.0f, dtype);
    check_assign("swiglu dinp", {N, 2 * C}, dtype,
                 [&](const Tensor& g, ops::GradWrite m) { ops::swiglu_backward(g, dyc, gu, m); });
    const Tensor weight = normal({C}, 1.0f, dtype), bias = normal({C}, 1.0f, dtype);
    const Tensor mean = nans({N}), rstd = nans({N}), ln = nans({N, C}, dtype);
    ops::layernorm_forward(ln, mean, rstd, x, weight, bias, 1e-5f);
    check_assign("layernorm dinp", {N, C}, dtype, [&](const Tensor& g, ops::GradWrite m) {
      ops::layernorm_backward(g, Tensor(), Tensor(), dyc, x, weight, mean, rstd, m);
    });
    ops::rmsnorm_forward(ln, rstd, x, weight, 1e-5f);
    check_assign("rmsnorm dinp", {N, C}, dtype, [&](const Tensor& g, ops::GradWrite m) {
      ops::rmsnorm_backward(g, Tensor(), dyc, x, weight, rstd, m);
    });
    const Tensor dy3 = normal({3, 5, 70}, 1.0f, dtype);
    for (float p : {0.3f, 0.0f}) {
      const ops::Dropout drop = dropout_of(p, 4, 6);
      check_assign("dropout dinp", {3, 5, 70}, dtype,
                   [&](const Tensor& g, ops::GradWrite m) { ops::dropout_backward(g, dy3, drop, m); });
      check_assign("bias_dropout_add dinp", {3, 5, 70}, dtype, [&](const Tensor& g, ops::GradWrite m) {
        ops::bias_dropout_add_backward(g, Tensor(), Tensor(), dy3, drop, m);
      });
      check_assign("bias_dropout_add dresidual", {3, 5, 70}, dtype, [&](const Tensor& g, ops::GradWrite m) {
        ops::bias_dropout_add_backward(Tensor(), Tensor(), g, dy3, drop, m);
      });
    }
  }
  // The cross-entropy's dlogits (any float dtype) and the loss's f32 dlosses.
  const int64_t V = 75;
  const Tensor logits = normal({N, V}, 3.0f);
  std::vector<int32_t> ids(N);
  for (int64_t i = 0; i < N; ++i) ids[i] = static_cast<int32_t>((i * 7) % V);
  buffers_.emplace_back(device(), N * sizeof(int32_t));
  const Tensor tgt = tensor_at(buffers_.back(), 0, DType::I32, {N});
  copy_from_host(tgt, ids.data(), ids.size() * sizeof(int32_t));
  const Tensor dlosses = normal({N}), lse = normal({N}, 0.1f, DType::F32);
  check_assign("cross_entropy dlogits", {N, V}, DType::F32, [&](const Tensor& g, ops::GradWrite m) {
    ops::cross_entropy_backward(g, dlosses, logits, tgt, lse, 0, 0, m);
  });
  const Tensor mask = upload({N}, Host(N, 1.0f));
  check_assign("masked_loss dlosses", {N}, DType::F32, [&](const Tensor& g, ops::GradWrite m) {
    ops::masked_loss_backward(g, mask, 0.25f, m);
  });
}

// The linears' parameter gradients (param_write): dweight (f32, as the model's main grads,
// and 16-bit) and dbias, from products of 16-bit and f32 operands, and from an empty product
// (no rows: a MoE expert without tokens), which assigns zeros. The 64 x 32 -> 64 shape is one
// the CPU's default mode multiplies on AMX tiles where the CPU has them (ops/cpu/amx_gemm.h).
TEST_P(Epilogue, AssignedParameterGradientsHaveTheBitsOfAccumulatingIntoZeros) {
  struct Shape {
    int64_t rows, C, OC;
  };
  for (const Shape shape : {Shape{37, 19, 70}, Shape{64, 32, 64}})
    for (int64_t N : {shape.rows, int64_t{0}})
      for (DType dtype : {DType::F32, DType::BF16}) {
        const int64_t rows = shape.rows, C = shape.C, OC = shape.OC;
        const Tensor x = normal({rows, C}, 1.0f, dtype).slice_rows(0, N), w = normal({OC, C}, 1.0f, dtype);
        const Tensor dy = normal({rows, OC}, 1.0f, dtype).slice_rows(0, N);
        const Tensor pre = normal({rows, OC}, 2.0f, dtype).slice_rows(0, N);
        const Tensor dinp = nans({rows, C}, dtype).slice_rows(0, N);
        SCOPED_TRACE("N " + std::to_string(N) + " C " + std::to_string(C));
        for (DType grad_dtype : {DType::F32, dtype}) {
          check_assign("linear dweight", {OC, C}, grad_dtype, [&](const Tensor& g, ops::GradWrite m) {
            ops::linear_backward(dinp, g, Tensor(), dy, x, w, kAssign, m);
          });
          check_assign("linear dbias", {OC}, grad_dtype, [&](const Tensor& g, ops::GradWrite m) {
            ops::linear_backward(Tensor(), Tensor(), g, dy, x, w, kAccumulate, m);
          });
          for (ops::GeluKind kind : {ops::GeluKind::Tanh, ops::GeluKind::Erf}) {
            check_assign("linear_bias_gelu dweight", {OC, C}, grad_dtype, [&](const Tensor& g, ops::GradWrite m) {
              ops::linear_bias_gelu_backward(dinp, g, Tensor(), nans({rows, OC}, dtype).slice_rows(0, N), dy, x, w, pre,
                                             kind, kAssign, m);
            });
            check_assign("linear_bias_gelu dbias", {OC}, grad_dtype, [&](const Tensor& g, ops::GradWrite m) {
              ops::linear_bias_gelu_backward(Tensor(), Tensor(), g, nans({rows, OC}, dtype).slice_rows(0, N), dy, x, w,
                                             pre, kind, kAccumulate, m);
            });
          }
        }
      }
}

// dweight_squares (ops.h GradSquares): the slot gains the sum of squares of dweight as the call
// leaves it (assigned or accumulated, f32 and 16-bit), the other slots and the gradient's bits
// stay as without it. The 64 x 32 -> 64 bf16 shape takes the squares from the CPU's AMX
// tiles where it has them (ops/cpu/amx_gemm.h); the others read the gradient again. Bound:
// sum_squares' 1e-12 relative.
TEST_P(Epilogue, WeightGradientSquaresAreThoseOfTheGradientWritten) {
  struct Shape {
    int64_t N, C, OC;
  };
  const auto squares_of = [](const Host& g) {
    double s = 0.0;
    for (float v : g) s += static_cast<double>(v) * v;
    return s;
  };
  for (const Shape shape : {Shape{37, 19, 70}, Shape{64, 32, 64}, Shape{0, 32, 64}})
    for (DType dtype : {DType::F32, DType::BF16})
      for (DType grad_dtype : {DType::F32, dtype})
        for (ops::GradWrite write : {kAssign, kAccumulate})
          for (bool gelu : {false, true}) {
            const int64_t N = shape.N, C = shape.C, OC = shape.OC;
            SCOPED_TRACE(std::string(gelu ? "linear_bias_gelu" : "linear") + " N " + std::to_string(N) + " " +
                         std::string(dtype_name(dtype)) + " grad " + std::string(dtype_name(grad_dtype)) +
                         (write == kAssign ? " assign" : " accumulate"));
            const Tensor x = normal({std::max<int64_t>(N, 1), C}, 1.0f, dtype).slice_rows(0, N);
            const Tensor w = normal({OC, C}, 1.0f, dtype);
            const Tensor dy = normal({std::max<int64_t>(N, 1), OC}, 1.0f, dtype).slice_rows(0, N);
            const Tensor pre = normal({std::max<int64_t>(N, 1), OC}, 2.0f, dtype).slice_rows(0, N);
            const Host before = normal_values(OC * C, 0.5f);
            const auto backward = [&](const Tensor& dw, ops::GradSquares squares) {
              const Tensor dpre = nans({std::max<int64_t>(N, 1), OC}, dtype).slice_rows(0, N);
              if (gelu)
                ops::linear_bias_gelu_backward(Tensor(), dw, Tensor(), dpre, dy, x, w, pre, ops::GeluKind::Tanh, kAssign,
                                               write, squares);
              else
                ops::linear_backward(Tensor(), dw, Tensor(), dy, x, w, kAssign, write, squares);
            };
            const Tensor plain = upload({OC, C}, before, grad_dtype), squared = upload({OC, C}, before, grad_dtype);
            std::vector<double> slots = {7.0, 0.5, 9.0};
            buffers_.emplace_back(device(), slots.size() * sizeof(double));
            const Tensor sums = tensor_at(buffers_.back(), 0, DType::I64, {3});
            copy_from_host(sums, slots.data(), slots.size() * sizeof(double));
            backward(plain, {});
            backward(squared, {sums, 1});
            EXPECT_EQ(bytes(squared), bytes(plain)) << "on " << GetParam();
            copy_to_host(slots.data(), slots.size() * sizeof(double), sums);
            const double want = squares_of(read(squared));
            EXPECT_EQ(slots[0], 7.0);
            EXPECT_EQ(slots[2], 9.0);
            EXPECT_NEAR(slots[1] - 0.5, want, 1e-12 * want) << "on " << GetParam();
            if (N > 0 || write == kAccumulate) EXPECT_GT(want, 0.0);  // else zeros were assigned
          }
}

TEST_P(Epilogue, CrossEntropyGradientOverwritesTheLogits) {
  // A shard [50, 125) of a 150-row vocabulary, in f32 and bf16: the gradient written over
  // the logits has the bits of the one written into another buffer.
  const int64_t N = 6, V = 75, vocab_start = 50, vocab_size = 150;
  std::vector<int32_t> ids = {60, 10, 124, 50, 149, 99};
  buffers_.emplace_back(device(), N * sizeof(int32_t));
  const Tensor targets = tensor_at(buffers_.back(), 0, DType::I32, {N});
  copy_from_host(targets, ids.data(), ids.size() * sizeof(int32_t));
  for (DType dtype : {DType::F32, DType::BF16}) {
    const Host values = normal_values(N * V, 3.0f);
    const Tensor logits = upload({N, V}, values, dtype), row_max = nans({N}), sums = nans({2, N});
    const Tensor sum_exp = sums.slice_rows(0, 1).view({N}), target_logit = sums.slice_rows(1, 1).view({N});
    const Tensor losses = nans({N}), lse = nans({N}), dlosses = normal({N});
    ops::cross_entropy_max(row_max, logits);
    ops::cross_entropy_sums(sum_exp, target_logit, logits, targets, row_max, vocab_start, vocab_size);
    ops::cross_entropy_finish(losses, lse, sum_exp, row_max, target_logit);
    const Tensor separate = nans({N, V}, dtype);
    ops::cross_entropy_backward(separate, dlosses, logits, targets, lse, vocab_start, vocab_size, kAssign);
    ops::cross_entropy_backward(logits, dlosses, logits, targets, lse, vocab_start, vocab_size, kAssign);
    EXPECT_EQ(bytes(logits), bytes(separate)) << dtype_name(dtype) << " on " << GetParam();
  }
  // Accumulating into the logits would add the gradient to them: a broken invariant, which
  // aborts naming it (checked once, on the CPU: the check is shared with the devices' host
  // code).
  if (GetParam() != "cpu") return;
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  const Tensor logits = normal({N, V}), lse = normal({N}), dlosses = normal({N});
  EXPECT_DEATH(ops::cross_entropy_backward(logits, dlosses, logits, targets, lse, vocab_start, vocab_size, kAccumulate),
               "in place needs GradWrite::Assign");
}

std::string test_name(const ::testing::TestParamInfo<std::string>& info) {
  std::string name = info.param;
  for (char& ch : name)
    if (ch == ':') ch = '_';
  return name;
}

INSTANTIATE_TEST_SUITE_P(Backends, Epilogue, ::testing::ValuesIn(backends()), test_name);

}  // namespace
