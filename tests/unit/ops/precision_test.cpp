// Each op against float64 with the bound of its precision class (ops/op.h, docs/ops.md), on
// every backend this binary has (cpu, strict, opencl:N, cuda:N), table-driven:
//
//   class      | |result - float64| <=                     | across backends
//   Exact      | (kSlack + n) * u * scale                   | the CPU's bits
//   OrderFree  | (kSlack + n) * u * scale                   | (any order)
//   Product16  | as OrderFree; u of the 16-bit dtype in a   | (any order)
//              | 16-bit run (its products may be 16-bit)    |
//
// n: the terms summed into one result; scale: the sum of their magnitudes (|result| for a
// map); u: the unit roundoff of the arithmetic (f32 2^-24, bf16 2^-9, double 2^-53);
// kSlack = 8 covers the few roundings around a sum and a backend's exp/log/tanh (a few ulp).
// A kernel that drops or doubles a term, or mixes up its arguments, is off by about
// `scale`, far beyond the bound. The float64 references are float64_reference.h's (shared
// with ops_test.cpp) and one-line formulas; every op of ops.inc has a case here or is listed
// in kNoFloat64Case with the test that covers it instead.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "tessera/core/tensor.h"
#include "tessera/device/device.h"
#include "tessera/device/registry.h"
#include "tessera/ops/kernel_table.h"
#include "tessera/ops/ops.h"
#include "float64_reference.h"

using namespace tessera;

namespace {

constexpr double kSlack = 8;
constexpr double kF32 = 0x1p-24, kBF16 = 0x1p-9, kF64 = 0x1p-53;

// One output of one case: the device's values, the float64 reference, and per element the
// magnitude `scale`; `terms` and `unit` as above.
struct Output {
  std::string name;
  std::vector<double> got{}, ref{}, scale{};
  int64_t terms = 0;
  double unit = kF32;
};

// Tensors on the device under test, from host values, and back.
class DeviceArena {
 public:
  explicit DeviceArena(Device& device) : device_(device) {}
  Tensor floats(const std::vector<float>& v, Shape s, DType dtype = DType::F32) {
    Tensor t = make(dtype, std::move(s));
    copy_floats_from_host(t, v.data(), v.size());
    return t;
  }
  Tensor ints(const std::vector<int32_t>& v, Shape s) {
    Tensor t = make(DType::I32, std::move(s));
    copy_from_host(t, v.data(), v.size() * sizeof(int32_t));
    return t;
  }
  Tensor zeros(Shape s, DType dtype = DType::F32) { return make(dtype, std::move(s)); }

 private:
  Tensor make(DType dtype, Shape s) {
    buffers_.emplace_back(device_, std::max<size_t>(static_cast<size_t>(shape_numel(s)) * dtype_size(dtype), 1));
    return tensor_at(buffers_.back(), 0, dtype, std::move(s));
  }
  Device& device_;
  std::vector<Buffer> buffers_;
};

std::vector<double> values(const Tensor& t) {
  std::vector<float> f(static_cast<size_t>(t.numel()));
  copy_floats_to_host(f.data(), f.size(), t);
  return {f.begin(), f.end()};
}
std::vector<double> doubles(const Tensor& t) {  // an I64 tensor holding doubles
  std::vector<double> d(static_cast<size_t>(t.numel()));
  copy_to_host(d.data(), d.size() * sizeof(double), t);
  return d;
}
std::vector<float> normal(size_t n, uint32_t seed, float std = 1.0f, float mean = 0.0f) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> dist(mean, std);
  std::vector<float> v(n);
  for (float& x : v) x = dist(gen);
  return v;
}
// The values of a 16-bit tensor as f32 (what the kernel reads).
std::vector<float> rounded(const std::vector<float>& v, DType dtype) {
  std::vector<uint16_t> bits(v.size());
  round_to_16bit(v.data(), v.size(), dtype, bits.data());
  std::vector<float> r(v.size());
  widen_16bit(bits.data(), v.size(), dtype, r.data());
  return r;
}
std::vector<double> magnitudes(const std::vector<double>& ref) {
  std::vector<double> m(ref.size());
  for (size_t i = 0; i < ref.size(); ++i) m[i] = std::fabs(ref[i]);
  return m;
}

// ---------------------------------------------------------------------------------------
// The cases: each runs its op once on `device` and returns its outputs with references.

using Case = std::function<std::vector<Output>(Device&)>;

std::vector<Output> layernorm_case(Device& device) {
  const int64_t N = 5, C = 64;
  const auto x = normal(N * C, 1), w = normal(C, 2, 0.5f, 1.0f), b = normal(C, 3);
  DeviceArena a(device);
  Tensor out = a.zeros({N, C}), mean = a.zeros({N}), rstd = a.zeros({N});
  ops::layernorm_forward(out, mean, rstd, a.floats(x, {N, C}), a.floats(w, {C}), a.floats(b, {C}), 1e-5f);
  Output o{"out", values(out), {}, {}, C};
  for (int64_t n = 0; n < N; ++n) {
    double m = 0, v = 0;
    for (int64_t c = 0; c < C; ++c) m += x[n * C + c];
    m /= C;
    for (int64_t c = 0; c < C; ++c) v += (x[n * C + c] - m) * (x[n * C + c] - m);
    const double rs = 1.0 / std::sqrt(v / C + 1e-5);
    for (int64_t c = 0; c < C; ++c) {
      const double xhat = (x[n * C + c] - m) * rs;
      o.ref.push_back(xhat * w[c] + b[c]);
      o.scale.push_back((std::fabs(xhat) + 1) * std::fabs(w[c]) + std::fabs(b[c]));
    }
  }
  return {o};
}

std::vector<Output> rmsnorm_case(Device& device) {
  const int64_t N = 5, C = 64;
  const auto x = normal(N * C, 4), w = normal(C, 5, 0.5f, 1.0f);
  DeviceArena a(device);
  Tensor out = a.zeros({N, C}), rstd = a.zeros({N});
  ops::rmsnorm_forward(out, rstd, a.floats(x, {N, C}), a.floats(w, {C}), 1e-5f);
  Output o{"out", values(out), {}, {}, C};
  for (int64_t n = 0; n < N; ++n) {
    double sq = 0;
    for (int64_t c = 0; c < C; ++c) sq += static_cast<double>(x[n * C + c]) * x[n * C + c];
    const double rs = 1.0 / std::sqrt(sq / C + 1e-5);
    for (int64_t c = 0; c < C; ++c) o.ref.push_back(x[n * C + c] * rs * w[c]);
  }
  o.scale = magnitudes(o.ref);
  return {o};
}

std::vector<Output> linear_case(Device& device) {
  const int64_t N = 6, C = 40, OC = 9;
  const auto x = normal(N * C, 6), w = normal(OC * C, 7), bias = normal(OC, 8);
  DeviceArena a(device);
  Tensor out = a.zeros({N, OC});
  ops::linear_forward(out, a.floats(x, {N, C}), a.floats(w, {OC, C}), a.floats(bias, {OC}));
  Output o{"out", values(out), {}, {}, C + 1};
  for (int64_t n = 0; n < N; ++n) {
    for (int64_t j = 0; j < OC; ++j) {
      double acc = bias[j], mag = std::fabs(bias[j]);
      for (int64_t c = 0; c < C; ++c) {
        acc += static_cast<double>(x[n * C + c]) * w[j * C + c];
        mag += std::fabs(static_cast<double>(x[n * C + c]) * w[j * C + c]);
      }
      o.ref.push_back(acc);
      o.scale.push_back(mag);
    }
  }
  return {o};
}

std::vector<Output> bias_add_case(Device& device) {
  const int64_t N = 7, OC = 5;
  const auto x = normal(N * OC, 9), bias = normal(OC, 10);
  DeviceArena a(device);
  Tensor out = a.zeros({N, OC}), dbias = a.zeros({OC});
  ops::bias_add_forward(out, a.floats(x, {N, OC}), a.floats(bias, {OC}));
  ops::bias_add_backward(dbias, a.floats(x, {N, OC}));
  Output fwd{"forward out", values(out)}, bwd{"backward dbias", values(dbias), {}, {}, N};
  for (int64_t i = 0; i < N * OC; ++i) fwd.ref.push_back(static_cast<double>(x[i]) + bias[i % OC]);
  fwd.scale = magnitudes(fwd.ref);
  for (int64_t j = 0; j < OC; ++j) {
    double sum = 0, mag = 0;
    for (int64_t n = 0; n < N; ++n) sum += x[n * OC + j], mag += std::fabs(x[n * OC + j]);
    bwd.ref.push_back(sum);
    bwd.scale.push_back(mag);
  }
  return {fwd, bwd};
}

// Attention's output in f32, or (Product16) in bf16 storage: the reference then reads the
// bf16 values the kernel reads, and u is bf16's.
std::vector<Output> attention_case(Device& device, DType dtype) {
  const int64_t B = 2, T = 7, NH = 2, HD = 8;
  std::vector<float> qkv = normal(B * T * NH * 3 * HD, 11);
  if (dtype != DType::F32) qkv = rounded(qkv, dtype);
  ops::Dropout dropout;
  dropout.p = 0.25f;
  dropout.key = {7, 3, 1};
  DeviceArena a(device);
  const ops::AttentionBuffers buffers = ops::attention_buffers(device, B, NH, T, dtype);
  Tensor out = a.zeros({B, T, NH * HD}, dtype), att = a.zeros(buffers.saved, buffers.saved_dtype);
  ops::attention_forward(out, att, a.floats(qkv, {B, T, NH * 3 * HD}, dtype), dropout);
  std::vector<double> ref, probs;
  ops_test::attention_reference(qkv.data(), B, T, NH, HD, dropout, ref, probs);
  // Each output sums T probabilities (each from HD products and a softmax over T) times
  // values: the scale is the largest |v| times the dropout factor 1/(1-p).
  double max_v = 0;
  for (float x : qkv) max_v = std::max(max_v, std::fabs(static_cast<double>(x)));
  Output o{"out", values(out), ref, std::vector<double>(ref.size(), max_v / (1 - dropout.p)), T + HD,
           dtype == DType::F32 ? kF32 : kBF16};
  return {o};
}

std::vector<Output> gelu_case(Device& device, ops::GeluKind kind) {
  const int64_t n = 1001;
  std::vector<float> x(n);
  for (int64_t i = 0; i < n; ++i) x[i] = -8.0f + 16.0f * static_cast<float>(i) / (n - 1);
  DeviceArena a(device);
  Tensor out = a.zeros({n});
  ops::gelu_forward(out, a.floats(x, {n}), kind);
  Output o{kind == ops::GeluKind::Tanh ? "tanh out" : "erf out", values(out)};
  for (float xi : x) {
    o.ref.push_back(ops_test::gelu_ref(xi, kind));
    // x * (1 + erf or tanh(...)) / 2: the sum 1 + ... cancels in the negative tail, so its
    // terms' magnitude is |x|.
    o.scale.push_back(std::fabs(xi));
  }
  return {o};
}

std::vector<Output> swiglu_case(Device& device) {
  const int64_t N = 4, F = 33;
  const auto x = normal(N * 2 * F, 12, 2.0f);
  DeviceArena a(device);
  Tensor out = a.zeros({N, F});
  ops::swiglu_forward(out, a.floats(x, {N, 2 * F}));
  Output o{"out", values(out)};
  for (int64_t n = 0; n < N; ++n) {
    for (int64_t f = 0; f < F; ++f) {
      const double g = x[n * 2 * F + f], u = x[n * 2 * F + F + f];
      o.ref.push_back(g / (1 + std::exp(-g)) * u);
    }
  }
  o.scale = magnitudes(o.ref);
  return {o};
}

std::vector<Output> residual_case(Device& device) {
  const int64_t n = 100;
  const auto x = normal(n, 13), y = normal(n, 14), dout = normal(n, 15);
  DeviceArena a(device);
  Tensor out = a.zeros({n}), da = a.floats(x, {n}), db = a.zeros({n});
  ops::residual_forward(out, a.floats(x, {n}), a.floats(y, {n}));
  ops::residual_backward(da, db, a.floats(dout, {n}));
  Output fwd{"forward out", values(out)}, bwd{"backward da", values(da)};
  for (int64_t i = 0; i < n; ++i) {
    fwd.ref.push_back(static_cast<double>(x[i]) + y[i]);
    bwd.ref.push_back(static_cast<double>(x[i]) + dout[i]);  // accumulated into da = x
  }
  fwd.scale = magnitudes(fwd.ref);
  bwd.scale = magnitudes(bwd.ref);
  return {fwd, bwd};
}

std::vector<Output> dropout_case(Device& device) {
  const int64_t B = 2, n = 200;
  const auto x = normal(B * n, 16);
  ops::Dropout d;
  d.p = 0.3f;
  d.key = {5, 2, 4};
  d.sample0 = 3;
  DeviceArena a(device);
  Tensor out = a.zeros({B, n});
  ops::dropout_forward(out, a.floats(x, {B, n}), d);
  Output o{"out", values(out)};
  for (int64_t b = 0; b < B; ++b)
    for (int64_t e = 0; e < n; ++e) o.ref.push_back(x[b * n + e] * ops_test::dropout_factor(d, b, e));
  o.scale = magnitudes(o.ref);
  return {o};
}

std::vector<Output> scale_and_fill_case(Device& device) {
  const int64_t n = 50;
  const auto x = normal(n, 17);
  DeviceArena a(device);
  Tensor t = a.floats(x, {n}), filled = a.zeros({n});
  ops::scale_inplace(t, 0.3f);
  ops::fill(filled, 0.1f);
  Output scaled{"scale_inplace", values(t)}, fill{"fill", values(filled)};
  for (float xi : x) scaled.ref.push_back(xi * static_cast<double>(0.3f));
  scaled.scale = magnitudes(scaled.ref);
  fill.ref.assign(n, 0.1);
  fill.scale.assign(n, 0.1);
  return {scaled, fill};
}

std::vector<Output> embedding_case(Device& device) {
  const int64_t B = 2, T = 6, C = 4, V = 5, P = 8;
  const std::vector<int32_t> tokens = {0, 3, 3, 4, 1, 3, 2, 2, 0, 3, 4, 1}, positions = {0, 1, 2, 3, 4, 5,
                                                                                         0, 1, 2, 3, 4, 5};
  const auto wte = normal(V * C, 18), wpe = normal(P * C, 19), dout = normal(B * T * C, 20);
  DeviceArena a(device);
  Tensor out = a.zeros({B, T, C}), dwte = a.zeros({V, C});
  Tensor tok = a.ints(tokens, {B, T}), pos = a.ints(positions, {B, T});
  ops::embedding_forward(out, tok, pos, a.floats(wte, {V, C}), a.floats(wpe, {P, C}), 0, 0);
  ops::embedding_backward(dwte, Tensor(), a.floats(dout, {B, T, C}), tok, pos, 0, 0);
  Output fwd{"forward out", values(out)}, bwd{"backward dwte", values(dwte), {}, {}, B * T};
  for (int64_t i = 0; i < B * T; ++i)
    for (int64_t c = 0; c < C; ++c)
      fwd.ref.push_back(static_cast<double>(wte[tokens[i] * C + c]) + wpe[positions[i] * C + c]);
  fwd.scale = magnitudes(fwd.ref);
  bwd.ref.assign(V * C, 0.0);
  bwd.scale.assign(V * C, 0.0);
  for (int64_t i = 0; i < B * T; ++i)
    for (int64_t c = 0; c < C; ++c) {
      bwd.ref[tokens[i] * C + c] += dout[i * C + c];
      bwd.scale[tokens[i] * C + c] += std::fabs(dout[i * C + c]);
    }
  return {fwd, bwd};
}

// The pieces of the cross-entropy on one shard (vocab_start 0), against log-softmax in double;
// the statistics by cross_entropy_max and _sums, or by cross_entropy_stats (`stats`).
std::vector<Output> cross_entropy_case(Device& device, bool stats) {
  const int64_t N = 4, V = 50;
  const auto logits = normal(N * V, 21, 3.0f);
  const std::vector<int32_t> targets = {0, 17, 49, 3};
  const auto dloss = normal(N, 22);
  DeviceArena a(device);
  Tensor x = a.floats(logits, {N, V}), tgt = a.ints(targets, {N});
  Tensor row_max = a.zeros({N}), sum_exp = a.zeros({N}), target_logit = a.zeros({N});
  Tensor losses = a.zeros({N}), lse = a.zeros({N}), dlogits = a.zeros({N, V});
  if (stats) {
    ops::cross_entropy_stats(row_max, sum_exp, target_logit, x, tgt);
  } else {
    ops::cross_entropy_max(row_max, x);
    ops::cross_entropy_sums(sum_exp, target_logit, x, tgt, row_max, 0, 0);
  }
  ops::cross_entropy_finish(losses, lse, sum_exp, row_max, target_logit);
  ops::cross_entropy_backward(dlogits, a.floats(dloss, {N}), x, tgt, lse, 0, 0);
  Output max{"row_max", values(row_max)}, sums{"sum_exp", values(sum_exp), {}, {}, V};
  Output loss{"losses", values(losses), {}, {}, V};
  Output grad{"dlogits", values(dlogits)};
  for (int64_t n = 0; n < N; ++n) {
    const float* row = logits.data() + n * V;
    const double mx = *std::max_element(row, row + V);
    max.ref.push_back(mx);
    max.scale.push_back(std::fabs(mx));
    double s = 0;
    for (int64_t v = 0; v < V; ++v) s += std::exp(row[v] - mx);
    sums.ref.push_back(s);
    sums.scale.push_back(s);  // positive terms
    const std::vector<double> ls = ops_test::log_softmax_row(row, V);
    loss.ref.push_back(-ls[targets[n]]);
    // logsumexp - target_logit: terms of the size of the logits.
    loss.scale.push_back(std::fabs(mx) + std::fabs(row[targets[n]]) + std::fabs(ls[targets[n]]));
    for (int64_t v = 0; v < V; ++v) {
      grad.ref.push_back((std::exp(ls[v]) - (v == targets[n])) * dloss[n]);
      // exp of (logit - logsumexp): its argument's rounding, relative to |logit|, scales the result.
      grad.scale.push_back((std::exp(ls[v]) * (1 + std::fabs(row[v]) + std::fabs(mx)) + 1) * std::fabs(dloss[n]));
    }
  }
  return {max, sums, loss, grad};
}

std::vector<Output> masked_loss_case(Device& device) {
  const int64_t n = 1000;
  const auto losses = normal(n, 23, 1.0f, 3.0f);
  std::vector<float> mask(n);
  for (int64_t i = 0; i < n; ++i) mask[i] = i % 3 == 0 ? 0.0f : 1.0f;
  DeviceArena a(device);
  Tensor sums = a.zeros({2}, DType::I64), dlosses = a.zeros({n});
  ops::masked_loss_sums(sums, a.floats(losses, {n}), a.floats(mask, {n}));
  ops::masked_loss_backward(dlosses, a.floats(mask, {n}), 0.25f);
  Output s{"sums", doubles(sums), {0.0, 0.0}, {0.0, 0.0}, n, kF64}, d{"dlosses", values(dlosses)};
  for (int64_t i = 0; i < n; ++i) {
    s.ref[0] += static_cast<double>(losses[i]) * mask[i];
    s.scale[0] += std::fabs(static_cast<double>(losses[i]) * mask[i]);
    s.ref[1] += mask[i];
    s.scale[1] += mask[i];
    d.ref.push_back(mask[i] * 0.25);
  }
  d.scale = magnitudes(d.ref);
  return {s, d};
}

std::vector<Output> sum_squares_case(Device& device) {
  const int64_t n = 70001;  // past one 65536-element chunk
  const auto x = normal(n, 24);
  DeviceArena a(device);
  Tensor sums = a.zeros({3}, DType::I64);
  ops::sum_squares(sums, 1, a.floats(x, {n}));
  double ref = 0;
  for (float xi : x) ref += static_cast<double>(xi) * xi;
  return {Output{"sums[1]", {doubles(sums)[1]}, {ref}, {ref}, n, kF64}};
}

// Two steps of AdamW and SGD against torch's rules stepped in double. Each update is a
// chain of a few roundings of values of the size of the parameter.
std::vector<Output> optimizer_case(Device& device) {
  const int64_t n = 64;
  const auto p0 = normal(n, 25), g1 = normal(n, 26), g2 = normal(n, 27);
  DeviceArena a(device);
  Tensor p = a.floats(p0, {n}), m = a.zeros({n}), v = a.zeros({n}), q = a.floats(p0, {n}), buf = a.zeros({n});
  const double lr = 1e-3, b1 = 0.9, b2 = 0.95, eps = 1e-8, wd = 0.1, slr = 0.1, mom = 0.9, swd = 0.01;
  std::vector<double> pd(p0.begin(), p0.end()), md(n), vd(n), qd(p0.begin(), p0.end()), bd(n);
  for (int step = 1; step <= 2; ++step) {
    const auto& g = step == 1 ? g1 : g2;
    Tensor gt = a.floats(g, {n});
    ops::adamw_update(p, gt, m, v, float(lr), float(b1), float(b2), float(eps), float(wd), step, 1.0f);
    ops::sgd_update(q, gt, buf, float(slr), float(mom), float(swd), step, 1.0f);
    const double fb1 = float(b1), fb2 = float(b2), flr = float(lr), fwd = float(wd), feps = float(eps);
    for (int64_t i = 0; i < n; ++i) {
      pd[i] *= 1 - flr * fwd;
      md[i] = fb1 * md[i] + (1 - fb1) * g[i];
      vd[i] = fb2 * vd[i] + (1 - fb2) * g[i] * g[i];
      const double mhat = md[i] / (1 - std::pow(fb1, step)), vhat = vd[i] / (1 - std::pow(fb2, step));
      pd[i] -= flr * mhat / (std::sqrt(vhat) + feps);
      const double d = g[i] + static_cast<double>(float(swd)) * qd[i];
      bd[i] = step == 1 ? d : float(mom) * bd[i] + d;
      qd[i] -= float(slr) * bd[i];
    }
  }
  Output adam{"adamw param", values(p), pd}, sgd{"sgd param", values(q), qd};
  // Each step rounds the parameter a few times (|p|) and the update (|lr * ...|, <= |p|).
  adam.scale = magnitudes(pd);
  for (size_t i = 0; i < qd.size(); ++i) sgd.scale.push_back(std::fabs(qd[i]) + std::fabs(slr * bd[i]));
  adam.terms = sgd.terms = 4;
  return {adam, sgd};
}

// A hand-made routing of N tokens, k routes each, over M permuted rows: routes 3 and 8 dropped,
// two padding rows (-1); slots and sources are each other's inverse (ops.inc's moe_* maps).
struct MoEMaps {
  static constexpr int64_t N = 6, k = 2, M = 12;
  std::vector<int32_t> sources = {0, 5, -1, 2, 11, 1, 4, 9, -1, 6, 10, 7};
  std::vector<int32_t> slots = std::vector<int32_t>(N * k, -1);
  MoEMaps() {
    for (int64_t m = 0; m < M; ++m)
      if (sources[m] >= 0) slots[sources[m]] = static_cast<int32_t>(m);
  }
};

std::vector<Output> moe_permute_case(Device& device) {
  const MoEMaps maps;
  const int64_t N = MoEMaps::N, k = MoEMaps::k, M = MoEMaps::M, C = 16;
  const auto x = normal(N * C, 60), dperm = normal(M * C, 61), dinp0 = normal(N * C, 62);
  const auto y = normal(M * C, 63), w = normal(N * k, 64), dout = normal(N * C, 65);
  DeviceArena a(device);
  Tensor perm = a.zeros({M, C}), dinp = a.floats(dinp0, {N, C}), out = a.zeros({N, C});
  Tensor dy = a.zeros({M, C}), dw = a.zeros({N, k});
  const Tensor sources = a.ints(maps.sources, {M}), slots = a.ints(maps.slots, {N, k}), wt = a.floats(w, {N, k});
  ops::moe_permute_forward(perm, a.floats(x, {N, C}), sources, k);
  ops::moe_permute_backward(dinp, a.floats(dperm, {M, C}), slots, ops::GradWrite::Accumulate);
  ops::moe_unpermute_forward(out, a.floats(y, {M, C}), slots, wt);
  ops::moe_unpermute_backward(dy, dw, a.floats(dout, {N, C}), a.floats(y, {M, C}), sources, wt);
  Output pf{"permute out", values(perm)}, pb{"permute dinp", values(dinp), {}, {}, k + 1};
  Output uf{"unpermute out", values(out), {}, {}, k}, ub{"unpermute dinp", values(dy)};
  Output uw{"unpermute dweights", values(dw), {}, {}, C};
  for (int64_t m = 0; m < M; ++m)
    for (int64_t c = 0; c < C; ++c) {
      const int32_t r = maps.sources[m];
      pf.ref.push_back(r < 0 ? 0.0 : x[r / k * C + c]);
      ub.ref.push_back(r < 0 ? 0.0 : static_cast<double>(w[r]) * dout[r / k * C + c]);
    }
  for (int64_t n = 0; n < N; ++n) {
    for (int64_t c = 0; c < C; ++c) {
      double d = dinp0[n * C + c], o = 0, ds = std::fabs(d), os = 0;
      for (int64_t j = 0; j < k; ++j) {
        const int32_t m = maps.slots[n * k + j];
        if (m < 0) continue;
        d += dperm[m * C + c], ds += std::fabs(dperm[m * C + c]);
        o += static_cast<double>(w[n * k + j]) * y[m * C + c], os += std::fabs(double(w[n * k + j]) * y[m * C + c]);
      }
      pb.ref.push_back(d), pb.scale.push_back(ds);
      uf.ref.push_back(o), uf.scale.push_back(os);
    }
    for (int64_t j = 0; j < k; ++j) {
      const int32_t m = maps.slots[n * k + j];
      double dot = 0, scale = 0;
      for (int64_t c = 0; m >= 0 && c < C; ++c)
        dot += static_cast<double>(dout[n * C + c]) * y[m * C + c], scale += std::fabs(double(dout[n * C + c]) * y[m * C + c]);
      uw.ref.push_back(dot), uw.scale.push_back(scale);
    }
  }
  pf.scale = magnitudes(pf.ref);
  ub.scale = magnitudes(ub.ref);
  return {pf, pb, uf, ub, uw};
}

// Three experts' GEMMs (one of them without tokens) against float64 linear layers.
std::vector<Output> grouped_linear_case(Device& device) {
  const std::vector<int64_t> rows = {2, 0, 3};
  const int64_t M = 5, I = 8, O = 5, G = 3;
  const auto x = normal(M * I, 70), dout = normal(M * O, 71), dinp0 = normal(M * I, 72);
  DeviceArena a(device);
  std::vector<std::vector<float>> w(G), dw0(G);
  std::vector<Tensor> wt, dwt;
  for (int64_t g = 0; g < G; ++g) {
    w[g] = normal(O * I, 73 + g), dw0[g] = normal(O * I, 76 + g);
    wt.push_back(a.floats(w[g], {O, I}));
    dwt.push_back(a.floats(dw0[g], {O, I}));
  }
  Tensor out = a.zeros({M, O}), dinp = a.floats(dinp0, {M, I});
  ops::grouped_linear_forward(out, a.floats(x, {M, I}), wt, rows);
  ops::grouped_linear_backward(dinp, dwt, a.floats(dout, {M, O}), a.floats(x, {M, I}), wt, rows,
                               ops::GradWrite::Accumulate);
  Output fwd{"out", values(out), {}, {}, I}, dx{"dinp", values(dinp), {}, {}, O + 1};
  Output dwo{"dweights", {}, {}, {}, M + 1};
  for (int64_t g = 0, first = 0; g < G; first += rows[g], ++g) {
    for (int64_t r = first; r < first + rows[g]; ++r) {
      for (int64_t o = 0; o < O; ++o) {
        double s = 0, sc = 0;
        for (int64_t i = 0; i < I; ++i) s += double(x[r * I + i]) * w[g][o * I + i], sc += std::fabs(double(x[r * I + i]) * w[g][o * I + i]);
        fwd.ref.push_back(s), fwd.scale.push_back(sc);
      }
      for (int64_t i = 0; i < I; ++i) {
        double s = dinp0[r * I + i], sc = std::fabs(s);
        for (int64_t o = 0; o < O; ++o) s += double(dout[r * O + o]) * w[g][o * I + i], sc += std::fabs(double(dout[r * O + o]) * w[g][o * I + i]);
        dx.ref.push_back(s), dx.scale.push_back(sc);
      }
    }
    const std::vector<double> got = values(dwt[g]);
    dwo.got.insert(dwo.got.end(), got.begin(), got.end());
    for (int64_t o = 0; o < O; ++o)
      for (int64_t i = 0; i < I; ++i) {
        double s = dw0[g][o * I + i], sc = std::fabs(s);
        for (int64_t r = first; r < first + rows[g]; ++r) s += double(dout[r * O + o]) * x[r * I + i], sc += std::fabs(double(dout[r * O + o]) * x[r * I + i]);
        dwo.ref.push_back(s), dwo.scale.push_back(sc);
      }
  }
  return {fwd, dx, dwo};
}

struct OpCase {
  ops::OpId op;
  Case run;
};

std::vector<OpCase> op_cases() {
  using namespace ops;
  const auto each = [](std::initializer_list<OpId> ids, Case run) {
    std::vector<OpCase> cases;
    for (OpId id : ids) cases.push_back({id, run});
    return cases;
  };
  std::vector<OpCase> all;
  auto add = [&all](std::vector<OpCase> cases) { all.insert(all.end(), cases.begin(), cases.end()); };
  add(each({layernorm_forward}, layernorm_case));
  add(each({rmsnorm_forward}, rmsnorm_case));
  add(each({linear_forward}, linear_case));
  add(each({bias_add_forward, bias_add_backward}, bias_add_case));
  add(each({attention_forward}, [](Device& d) { return attention_case(d, DType::F32); }));
  add(each({attention_forward}, [](Device& d) { return attention_case(d, DType::BF16); }));
  add(each({gelu_forward}, [](Device& d) { return gelu_case(d, GeluKind::Tanh); }));
  add(each({gelu_forward}, [](Device& d) { return gelu_case(d, GeluKind::Erf); }));
  add(each({swiglu_forward}, swiglu_case));
  add(each({residual_forward, residual_backward}, residual_case));
  add(each({dropout_forward}, dropout_case));
  add(each({scale_inplace, fill}, scale_and_fill_case));
  add(each({embedding_forward, embedding_backward}, embedding_case));
  // The Exact max's output (its bits are the CPU's), then the OrderFree pieces' outputs.
  add(each({cross_entropy_max},
           [](Device& d) { auto o = cross_entropy_case(d, false); return std::vector<Output>(o.begin(), o.begin() + 1); }));
  add(each({cross_entropy_sums, cross_entropy_finish, cross_entropy_backward},
           [](Device& d) { auto o = cross_entropy_case(d, false); return std::vector<Output>(o.begin() + 1, o.end()); }));
  add(each({cross_entropy_stats}, [](Device& d) { return cross_entropy_case(d, true); }));
  add(each({masked_loss_sums, masked_loss_backward}, masked_loss_case));
  add(each({sum_squares}, sum_squares_case));
  add(each({adamw_update, sgd_update}, optimizer_case));
  // One run gives both families' outputs: the Exact permute's, then the OrderFree unpermute's.
  add(each({moe_permute_forward, moe_permute_backward},
           [](Device& d) { auto o = moe_permute_case(d); return std::vector<Output>(o.begin(), o.begin() + 2); }));
  add(each({moe_unpermute_forward, moe_unpermute_backward},
           [](Device& d) { auto o = moe_permute_case(d); return std::vector<Output>(o.begin() + 2, o.end()); }));
  add(each({grouped_linear_forward, grouped_linear_backward}, grouped_linear_case));
  return all;
}

// The ops without a float64 case here, and what tests them instead.
const std::vector<ops::OpId> kNoFloat64Case = {
    // Backwards of maps and norms: finite differences (ops_test.cpp, llama_ops_test.cpp) and
    // the CPU on every backend (backend_ops_test.cpp).
    ops::layernorm_backward, ops::rmsnorm_backward, ops::linear_backward, ops::attention_backward,
    ops::swiglu_backward, ops::gelu_backward, ops::dropout_backward, ops::attention_qkv_backward,
    // RoPE against Megatron's formula in double (llama_ops_test.cpp's qkv_reference).
    ops::attention_qkv_forward,
    // The fused attention against float64, finite differences and the unfused ops, with RoPE,
    // grouped queries and dropout, within its stated bounds (flash_attention_test.cpp).
    ops::flash_attention_forward, ops::flash_attention_backward, ops::flash_attention_scratch,
    // The ring's keys and values apart, element for element (flash_attention_test.cpp).
    ops::attention_kv_pack, ops::attention_kv_unpack,
    // The fused epilogues against float64 within their stated bounds, finite differences and
    // the unfused ops (epilogue_test.cpp).
    ops::linear_bias_gelu_forward, ops::linear_bias_gelu_backward, ops::bias_dropout_add_forward,
    ops::bias_dropout_add_backward,
    // The multi-tensor step against the per-tensor ops bit for bit, the norm against float64
    // (multi_tensor_test.cpp).
    ops::multi_tensor_adamw, ops::multi_tensor_sgd, ops::multi_tensor_sum_squares,
    ops::multi_tensor_sum_squares_workspace, ops::grad_norm_finish,
    // No arithmetic: shapes, permutations, the RNG's and the dtype conversion's bits
    // (backend_ops_test.cpp, storage_dtype_test.cpp).
    ops::attention_buffers, ops::sequence_to_rank_major, ops::rank_major_to_sequence, ops::init_normal,
    ops::convert};

// The float64 bound, the same formula for every class (the table above); a Product16 case
// in a 16-bit run sets u to its dtype's.
double bound(const Output& o, size_t i) {
  return (kSlack + static_cast<double>(o.terms)) * o.unit * o.scale[i];
}

std::vector<std::string> devices_under_test() {
  std::vector<std::string> specs = {"cpu", "strict"};
  for (const std::string& backend : device_backends()) {
    if (backend == "cpu") continue;
    for (int i = 0; i < device_count(backend); ++i) specs.push_back(backend + ":" + std::to_string(i));
  }
  return specs;
}

class OpPrecision : public ::testing::TestWithParam<std::string> {};

TEST_P(OpPrecision, EachOpWithinItsClassBoundOfFloat64) {
  Device& device = open_device(GetParam());
  for (const OpCase& c : op_cases()) {
    const ops::Precision precision = ops::precision_of(c.op);
    if (!ops::supports(device, c.op)) continue;  // an op the backend lacks (docs/backends.md)
    const std::vector<Output> outputs = c.run(device);
    // Exact: the CPU's bits too (the CPU is the reference backend).
    const std::vector<Output> cpu = precision == ops::Precision::Exact ? c.run(cpu_device()) : outputs;
    for (size_t k = 0; k < outputs.size(); ++k) {
      const Output& o = outputs[k];
      SCOPED_TRACE(std::string(ops::op_name(c.op)) + " (" + ops::precision_name(precision) + "): " + o.name);
      ASSERT_EQ(o.got.size(), o.ref.size());
      ASSERT_EQ(o.scale.size(), o.ref.size());
      int64_t beyond = 0, differ = 0;
      double worst = 0;
      for (size_t i = 0; i < o.got.size(); ++i) {
        const double err = std::fabs(o.got[i] - o.ref[i]), b = bound(o, i);
        worst = std::max(worst, b > 0 ? err / b : (err > 0 ? INFINITY : 0));
        beyond += !(err <= b);
        differ += std::memcmp(&o.got[i], &cpu[k].got[i], sizeof(double)) != 0;
      }
      EXPECT_EQ(beyond, 0) << "elements beyond the bound; worst error / bound " << worst;
      if (precision == ops::Precision::Exact) EXPECT_EQ(differ, 0) << "elements differ from the CPU's bits";
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Devices, OpPrecision, ::testing::ValuesIn(devices_under_test()),
                         [](const auto& info) {
                           std::string name = info.param;
                           std::replace(name.begin(), name.end(), ':', '_');
                           return name;
                         });

// Every op of ops.inc has a float64 case above or is listed in kNoFloat64Case: a new op
// must choose.
TEST(OpPrecision, EveryOpHasACaseOrIsListed) {
  std::vector<ops::OpId> covered = kNoFloat64Case;
  for (const OpCase& c : op_cases()) covered.push_back(c.op);
  for (ops::OpId op : ops::all_ops())
    EXPECT_NE(std::find(covered.begin(), covered.end(), op), covered.end())
        << ops::op_name(op) << " has no float64 case in precision_test.cpp and is not in kNoFloat64Case";
}

// The class is queryable by name and from the op itself, and agrees.
TEST(OpPrecision, ClassesAreQueryable) {
  EXPECT_EQ(ops::precision_of("attention_forward"), ops::Precision::Product16);
  EXPECT_EQ(ops::precision_of("layernorm_forward"), ops::Precision::OrderFree);
  EXPECT_EQ(ops::precision_of("adamw_update"), ops::Precision::Exact);
  EXPECT_EQ(ops::precision_of("no_such_op"), std::nullopt);
  EXPECT_EQ(ops::fill.precision, ops::Precision::Exact);
  for (ops::OpId op : ops::all_ops()) {
    EXPECT_EQ(ops::op_named(ops::op_name(op)), op);
    EXPECT_EQ(ops::precision_of(ops::op_name(op)), ops::precision_of(op));
  }
  EXPECT_EQ(ops::all_ops().size(), static_cast<size_t>(ops::kOpCount));
}

}  // namespace
