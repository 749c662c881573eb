// The fused attention of ops.h (flash_attention_forward/backward) on every backend that has it
// (the CPU, the strict device, every OpenCL device):
// - forward (out and the log-sum-exp) and backward (dqkv) against a float64 evaluation of the
//   formulas: Megatron's grouped QKV split, RoPE (rope_utils.py, non-interleaved), causal
//   softmax of q.k / sqrt(HD), its gradient, the group's heads summed into its k and v;
// - the backward against central finite differences (CPU; gradient buffers pre-filled, so a
//   kernel that sets instead of accumulating fails);
// - against the unfused ops (attention_qkv + attention_forward/backward) with dropout on, in
//   f32 and bf16: within the precision class, and the same elements dropped (a case whose
//   output reads the dropout mask out directly, compared exactly);
// - block pairs of a sequence split over context-parallel ranks (positions, kv from another
//   tensor, merging by the log-sum-exp) adding up to the whole sequence's attention, and the
//   keys and values packed apart for the ring (attention_kv_pack/unpack);
// GQA and GPT layouts, head dims that are and are not whole vectors, T not a multiple of the
// kernel's tile. Each tolerance sits next to its case with the reason for its size.
#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "grad_check.h"
#include "host_values.h"
#include "tessera/core/dtype.h"
#include "tessera/core/tensor.h"
#include "tessera/device/device.h"
#include "tessera/device/registry.h"
#include "tessera/ops/kernel_table.h"
#include "tessera/ops/ops.h"

using namespace tessera;

namespace {

struct Case {
  int64_t B, T, NG, R, HD, rope_dim;
  int64_t NH() const { return NG * R; }
  int64_t qkv_row() const { return NG * (R + 2) * HD; }
  ops::Rope rope() const { return {.dim = rope_dim, .base = 10000.0f, .scaling = {}}; }
};
// GQA with half the channels rotated and T past one 64-wide tile; GPT's layout (R = 1, no
// rotation) with a head dim that is not a whole vector; one group of 3 heads, fully rotated,
// over three tiles and a bit.
const Case kCases[] = {{2, 70, 2, 2, 16, 8}, {1, 37, 3, 1, 24, 0}, {1, 131, 1, 3, 8, 8}};

std::string describe(const Case& c) {
  return "B" + std::to_string(c.B) + " T" + std::to_string(c.T) + " NG" + std::to_string(c.NG) + " R" +
         std::to_string(c.R) + " HD" + std::to_string(c.HD) + " rope" + std::to_string(c.rope_dim);
}

// ---- the float64 reference ------------------------------------------------------------

// Head h's q (or the group's k, v) of sample b at position t, rotated in double by the f32
// angle t * inv_freq as Megatron computes it.
struct Reference {
  const Case& c;
  const std::vector<float>& qkv;
  std::vector<double> cs, sn;  // [T, half]
  explicit Reference(const Case& cs_, const std::vector<float>& qkv_) : c(cs_), qkv(qkv_) {
    const int64_t half = c.rope_dim / 2;
    cs.resize(static_cast<size_t>(c.T * half));
    sn.resize(cs.size());
    for (int64_t t = 0; t < c.T; ++t)
      for (int64_t i = 0; i < half; ++i) {
        const double theta = static_cast<float>(t) * ops::rope_inv_freq(c.rope(), i);
        cs[t * half + i] = std::cos(theta);
        sn[t * half + i] = std::sin(theta);
      }
  }
  // Rotates x (HD) of position t by sign * theta.
  void rotate(double* x, int64_t t, double sign) const {
    const int64_t half = c.rope_dim / 2;
    for (int64_t i = 0; i < half; ++i) {
      const double co = cs[t * half + i], si = sign * sn[t * half + i], a = x[i], b = x[i + half];
      x[i] = a * co - b * si;
      x[i + half] = b * co + a * si;
    }
  }
  // col: the head's first column in the grouped row.
  std::vector<double> head(int64_t b, int64_t col, bool rotated) const {
    std::vector<double> x(static_cast<size_t>(c.T * c.HD));
    for (int64_t t = 0; t < c.T; ++t) {
      for (int64_t i = 0; i < c.HD; ++i) x[t * c.HD + i] = qkv[(b * c.T + t) * c.qkv_row() + col + i];
      if (rotated) rotate(&x[t * c.HD], t, 1.0);
    }
    return x;
  }
  int64_t q_col(int64_t h) const { return (h / c.R) * (c.R + 2) * c.HD + (h % c.R) * c.HD; }
  int64_t k_col(int64_t g) const { return g * (c.R + 2) * c.HD + c.R * c.HD; }

  // Probabilities [T,T] of head h of sample b, and the log-sum-exp of each row.
  void probabilities(int64_t b, int64_t h, std::vector<double>& P, std::vector<double>& lse) const {
    const std::vector<double> q = head(b, q_col(h), true), k = head(b, k_col(h / c.R), true);
    const double scale = 1.0 / std::sqrt(static_cast<double>(c.HD));
    P.assign(static_cast<size_t>(c.T * c.T), 0.0);
    lse.assign(static_cast<size_t>(c.T), 0.0);
    for (int64_t t = 0; t < c.T; ++t) {
      double mx = -INFINITY;
      for (int64_t u = 0; u <= t; ++u) {
        double s = 0;
        for (int64_t i = 0; i < c.HD; ++i) s += q[t * c.HD + i] * k[u * c.HD + i];
        P[t * c.T + u] = s * scale;
        mx = std::max(mx, s * scale);
      }
      double sum = 0;
      for (int64_t u = 0; u <= t; ++u) sum += std::exp(P[t * c.T + u] - mx);
      for (int64_t u = 0; u <= t; ++u) P[t * c.T + u] = std::exp(P[t * c.T + u] - mx) / sum;
      lse[t] = mx + std::log(sum);
    }
  }

  // out [B,T,NH*HD], lse [B,NH,T]; with `scale`, also the magnitudes of their terms: for out,
  // sum |P v| over the keys; for lse, the largest sum |q_i k_i| / sqrt(HD) of a visible key (a
  // score's error moves the log-sum-exp by at most the largest one).
  struct Magnitudes {
    std::vector<double> out, lse, dqkv;
  };
  void forward(std::vector<double>& out, std::vector<double>& lse, Magnitudes* scale = nullptr) const {
    const int64_t NH = c.NH(), T = c.T, HD = c.HD;
    out.assign(static_cast<size_t>(c.B * T * NH * HD), 0.0);
    lse.assign(static_cast<size_t>(c.B * NH * T), 0.0);
    if (scale) scale->out = out, scale->lse = lse;
    std::vector<double> P, l;
    for (int64_t b = 0; b < c.B; ++b)
      for (int64_t h = 0; h < NH; ++h) {
        probabilities(b, h, P, l);
        const std::vector<double> v = head(b, k_col(h / c.R) + HD, false);
        const std::vector<double> q = head(b, q_col(h), true), k = head(b, k_col(h / c.R), true);
        for (int64_t t = 0; t < T; ++t) {
          lse[(b * NH + h) * T + t] = l[t];
          for (int64_t u = 0; u <= t; ++u) {
            double qk = 0;
            for (int64_t i = 0; i < HD; ++i) {
              out[(b * T + t) * NH * HD + h * HD + i] += P[t * T + u] * v[u * HD + i];
              if (scale) scale->out[(b * T + t) * NH * HD + h * HD + i] += P[t * T + u] * std::fabs(v[u * HD + i]);
              qk += std::fabs(q[t * HD + i] * k[u * HD + i]);
            }
            if (scale) {
              double& m = scale->lse[(b * NH + h) * T + t];
              m = std::max(m, qk / std::sqrt(static_cast<double>(HD)));
            }
          }
        }
      }
  }

  // dqkv [B,T,qkv_row] of L = sum(out * dout); with `mag`, the magnitudes of its terms (each
  // score gradient P (dp - dot) taken as P (|dp| + sum |dout_i out_i|), the size its rounding
  // errors scale with, a 16-bit out included; a rotated pair of channels the sum of both).
  std::vector<double> backward(const std::vector<float>& dout, Magnitudes* mag = nullptr) const {
    const int64_t NH = c.NH(), T = c.T, HD = c.HD;
    const double scale = 1.0 / std::sqrt(static_cast<double>(HD));
    std::vector<double> dqkv(static_cast<size_t>(c.B * T * c.qkv_row()), 0.0), P, l;
    if (mag) mag->dqkv = dqkv;
    for (int64_t b = 0; b < c.B; ++b)
      for (int64_t h = 0; h < NH; ++h) {
        probabilities(b, h, P, l);
        const int64_t g = h / c.R;
        const std::vector<double> q = head(b, q_col(h), true), k = head(b, k_col(g), true),
                                  v = head(b, k_col(g) + HD, false);
        std::vector<double> dq(static_cast<size_t>(T * HD), 0.0), dk = dq, dv = dq, mq = dq, mk = dq, mv = dq;
        for (int64_t t = 0; t < T; ++t) {
          const float* g_t = &dout[(b * T + t) * NH * HD + h * HD];
          std::vector<double> dp(static_cast<size_t>(t + 1));
          double dot = 0, dot_mag = 0;  // dot = dout . out; dot_mag = sum |dout_i out_i|
          std::vector<double> out_t(static_cast<size_t>(HD), 0.0);
          for (int64_t u = 0; u <= t; ++u) {
            double s = 0;
            for (int64_t i = 0; i < HD; ++i) {
              s += g_t[i] * v[u * HD + i];
              out_t[i] += P[t * T + u] * v[u * HD + i];
            }
            dp[u] = s;
            dot += P[t * T + u] * s;
          }
          for (int64_t i = 0; i < HD; ++i) dot_mag += std::fabs(g_t[i] * out_t[i]);
          for (int64_t u = 0; u <= t; ++u) {
            const double ds = P[t * T + u] * (dp[u] - dot) * scale, p = P[t * T + u];
            const double ds_mag = p * (std::fabs(dp[u]) + dot_mag) * scale;
            for (int64_t i = 0; i < HD; ++i) {
              dq[t * HD + i] += ds * k[u * HD + i];
              dk[u * HD + i] += ds * q[t * HD + i];
              dv[u * HD + i] += p * g_t[i];
              mq[t * HD + i] += ds_mag * std::fabs(k[u * HD + i]);
              mk[u * HD + i] += ds_mag * std::fabs(q[t * HD + i]);
              mv[u * HD + i] += p * std::fabs(g_t[i]);
            }
          }
        }
        for (int64_t t = 0; t < T; ++t) {
          rotate(&dq[t * HD], t, -1.0);
          rotate(&dk[t * HD], t, -1.0);
          double* row = &dqkv[(b * T + t) * c.qkv_row()];
          for (int64_t i = 0; i < HD; ++i) {
            row[q_col(h) + i] += dq[t * HD + i];
            row[k_col(g) + i] += dk[t * HD + i];
            row[k_col(g) + HD + i] += dv[t * HD + i];
          }
          if (!mag) continue;
          const int64_t half = c.rope_dim / 2;
          double* m = &mag->dqkv[(b * T + t) * c.qkv_row()];
          for (int64_t i = 0; i < HD; ++i) {
            const int64_t pair = i < half ? i + half : i < 2 * half ? i - half : i;
            const double rotated = pair == i ? 0.0 : 1.0;
            m[q_col(h) + i] += mq[t * HD + i] + rotated * mq[t * HD + pair];
            m[k_col(g) + i] += mk[t * HD + i] + rotated * mk[t * HD + pair];
            m[k_col(g) + HD + i] += mv[t * HD + i];
          }
        }
      }
    return dqkv;
  }
};

// ---- devices --------------------------------------------------------------------------

std::vector<std::string> backends_with_flash_attention() {
  std::vector<std::string> specs = {"cpu", "strict"};
  for (const std::string& backend : device_backends()) {
    if (backend == "cpu" || backend == "cuda") continue;  // CUDA: cuDNN's SDPA comes later (issue 29)
    for (int i = 0; i < device_count(backend); ++i) specs.push_back(backend + ":" + std::to_string(i));
  }
  return specs;
}

class FlashAttention : public ::testing::TestWithParam<std::string> {
 protected:
  Device& device() { return open_device(GetParam()); }
  Tensor upload(DType dtype, const Shape& shape, const void* host) {
    buffers_.emplace_back(device(), std::max<size_t>(static_cast<size_t>(shape_numel(shape)) * dtype_size(dtype), 1));
    Tensor t = tensor_at(buffers_.back(), 0, dtype, shape);
    if (host) copy_from_host(t, host, t.bytes());
    return t;
  }
  // f32 values stored in dtype (rounded on the host).
  Tensor values(DType dtype, const Shape& shape, const std::vector<float>& v) {
    if (dtype == DType::F32) return upload(dtype, shape, v.data());
    std::vector<uint16_t> h(v.size());
    for (size_t i = 0; i < v.size(); ++i) h[i] = dtype == DType::BF16 ? f32_to_bf16(v[i]) : f32_to_f16(v[i]);
    return upload(dtype, shape, h.data());
  }
  Tensor zeros(DType dtype, const Shape& shape) {
    Tensor t = upload(dtype, shape, nullptr);
    fill_zero(t);
    return t;
  }
  std::vector<float> normal(int64_t n, float std = 1.0f) {
    std::normal_distribution<float> dist(0.0f, std);
    std::vector<float> v(static_cast<size_t>(n));
    for (float& x : v) x = dist(gen_);
    return v;
  }
  static std::vector<float> read(const Tensor& t) { return testing_support::host_values(t); }
  // Every |got - ref| <= bound * (1 + |ref|); reports the worst element.
  template <typename R>
  static void expect_near_all(const char* what, const std::vector<float>& got, const std::vector<R>& ref,
                              double bound) {
    ASSERT_EQ(got.size(), ref.size()) << what;
    double worst = 0;
    size_t at = 0;
    for (size_t i = 0; i < got.size(); ++i) {
      const double e = std::fabs(got[i] - static_cast<double>(ref[i])) / (1.0 + std::fabs(static_cast<double>(ref[i])));
      if (!(e <= worst)) worst = e, at = i;
    }
    EXPECT_LE(worst, bound) << what << ": worst at " << at << ", got " << got[at] << ", want " << ref[at];
  }

  // The unfused path of the model: attention_qkv (when the layout needs regrouping) then
  // attention_forward; and back.
  struct Unfused {
    Tensor heads, att, out, d_heads, scratch;
  };
  Unfused unfused_forward(const Case& c, DType dtype, Tensor qkv, const ops::Dropout& drop) {
    Unfused u;
    const int64_t NH = c.NH(), T = c.T, HD = c.HD;
    const bool regroup = c.R > 1 || c.rope_dim > 0;
    u.heads = regroup ? zeros(dtype, {c.B, T, NH * 3 * HD}) : qkv;
    if (regroup) ops::attention_qkv_forward(u.heads, qkv, c.NG, c.rope());
    const ops::AttentionBuffers buffers = ops::attention_buffers(device(), c.B, NH, T, dtype);
    u.att = zeros(buffers.saved_dtype, buffers.saved);
    u.scratch = zeros(DType::F32, buffers.scratch);
    u.out = zeros(dtype, {c.B, T, NH * HD});
    ops::attention_forward(u.out, u.att, u.heads, drop);
    return u;
  }
  // dqkv += the unfused backward of dout.
  void unfused_backward(const Case& c, DType dtype, Unfused& u, Tensor dqkv, Tensor dout, const ops::Dropout& drop) {
    const bool regroup = c.R > 1 || c.rope_dim > 0;
    u.d_heads = regroup ? zeros(dtype, u.heads.shape) : dqkv;
    ops::attention_backward(u.d_heads, u.scratch, dout, u.heads, u.att, drop);
    if (regroup) ops::attention_qkv_backward(dqkv, u.d_heads, c.NG, c.rope());
  }

// Forward and backward of case c on this backend against the float64 reference.
  void expect_matches_float64(const Case& c) {
    SCOPED_TRACE(describe(c));
    const int64_t NH = c.NH(), T = c.T, HD = c.HD;
    const std::vector<float> qkv_h = normal(c.B * T * c.qkv_row()), dout_h = normal(c.B * T * NH * HD);
    const std::vector<float> prefill = normal(c.B * T * c.qkv_row());
    Tensor qkv = values(DType::F32, {c.B, T, c.qkv_row()}, qkv_h);
    Tensor out = zeros(DType::F32, {c.B, T, NH * HD}), lse = zeros(DType::F32, {c.B, NH, T});
    ops::flash_attention_forward(out, lse, qkv, Tensor(), c.NG, c.rope(), ops::Dropout{}, {});
    const Reference ref(c, qkv_h);
    std::vector<double> out_ref, lse_ref;
    ref.forward(out_ref, lse_ref);
    // f32 dot products of HD terms and sums of up to T exponentials (exp within 2 ulp), in
    // tiles with a running max: tens of ulp on N(0,1) inputs; measured <= 3.2e-7.
    expect_near_all("out", read(out), out_ref, 2e-6);
    expect_near_all("lse", read(lse), lse_ref, 2e-6);

    Tensor dqkv = values(DType::F32, qkv.shape, prefill), dout = values(DType::F32, out.shape, dout_h);
    Tensor scratch = zeros(DType::F32, ops::flash_attention_scratch(device(), c.B, NH, T));
    ops::flash_attention_backward(dqkv, Tensor(), scratch, dout, qkv, Tensor(), out, lse, c.NG, c.rope(), ops::Dropout{}, {});
    std::vector<double> want = ref.backward(dout_h);
    for (size_t i = 0; i < want.size(); ++i) want[i] += prefill[i];  // the backward accumulates
    // Gradients are sums over up to T keys or queries of products of the above, the group's R
    // heads summed into k and v: measured <= 1.1e-6.
    expect_near_all("dqkv", read(dqkv), want, 1e-5);
  }

  std::mt19937 gen_{2024};
  std::vector<Buffer> buffers_;
};

ops::Dropout dropout_of(float p, uint64_t element_offset = 0) {
  ops::Dropout d;
  d.p = p;
  d.key = {.seed = 42, .iteration = 3, .site = 7};
  d.sample0 = 5;
  d.element_offset = element_offset;
  return d;
}

TEST_P(FlashAttention, MatchesFloat64) {
  for (const Case& c : kCases) expect_matches_float64(c);
}

// Longer sequences, not whole tiles: 280 (B 2, 4 heads) and 257 rows once crashed OpenCL on
// PoCL, whose work-groups (its own choice, up to 4096 work-items) kept every work-item's
// private rows on a worker thread's stack; 320 is whole tiles.
TEST_P(FlashAttention, MatchesFloat64OnLongerSequences) {
  for (const Case& c : {Case{2, 280, 2, 2, 16, 8}, Case{1, 257, 1, 3, 8, 0}, Case{1, 320, 2, 1, 8, 8}})
    expect_matches_float64(c);
}

// A 16-bit run may multiply bf16 operands (the CPU does on AMX: q, k, v, dout, the
// probabilities and the score gradients rounded to bf16, sums in f32): out, lse and dqkv
// within the Product16 bound of ops.inc against float64 on the bf16 inputs, (8 + n) u sum|terms|
// with u = 2^-9 (precision_test.cpp's formula; n: the terms of one result, T or HD), and within
// a bound that does not grow with n, 8 u sum|terms|: every product has a few bf16 roundings,
// the f32 sums add ~2^-24 n (measured with bf16 products on AMX: at most 2.8, 0.74 and 3.5 u
// sum|terms| for out, lse and dqkv; OpenCL, f32 products of the bf16 values: 1.8, 0, 1.8).
TEST_P(FlashAttention, Bf16WithinProduct16BoundOfFloat64) {
  constexpr double kBf16 = 0x1p-9, kSlack = 8;
  for (const Case& c : kCases) {
    SCOPED_TRACE(describe(c));
    const int64_t NH = c.NH(), T = c.T, HD = c.HD;
    std::vector<float> qkv_h = normal(c.B * T * c.qkv_row()), dout_h = normal(c.B * T * NH * HD);
    for (std::vector<float>* v : {&qkv_h, &dout_h})  // the values the bf16 tensors hold
      for (float& x : *v) x = bf16_to_f32(f32_to_bf16(x));
    Tensor qkv = values(DType::BF16, {c.B, T, c.qkv_row()}, qkv_h);
    Tensor out = zeros(DType::BF16, {c.B, T, NH * HD}), lse = zeros(DType::F32, {c.B, NH, T});
    ops::flash_attention_forward(out, lse, qkv, Tensor(), c.NG, c.rope(), ops::Dropout{}, {});
    Tensor dqkv = zeros(DType::BF16, qkv.shape), dout = values(DType::BF16, out.shape, dout_h);
    Tensor scratch = zeros(DType::F32, ops::flash_attention_scratch(device(), c.B, NH, T));
    ops::flash_attention_backward(dqkv, Tensor(), scratch, dout, qkv, Tensor(), out, lse, c.NG, c.rope(),
                                  ops::Dropout{}, {});
    const Reference ref(c, qkv_h);
    Reference::Magnitudes mag;
    std::vector<double> out_ref, lse_ref;
    ref.forward(out_ref, lse_ref, &mag);
    const std::vector<double> dqkv_ref = ref.backward(dout_h, &mag);
    struct Check {
      const char* name;
      std::vector<float> got;
      const std::vector<double>&ref, &scale;
      int64_t terms;
    };
    for (const Check& k : {Check{"out", read(out), out_ref, mag.out, T}, Check{"lse", read(lse), lse_ref, mag.lse, HD},
                           Check{"dqkv", read(dqkv), dqkv_ref, mag.dqkv, T}}) {
      ASSERT_EQ(k.got.size(), k.ref.size()) << k.name;
      double worst = 0;  // |error| / (u sum|terms|)
      size_t at = 0;
      for (size_t i = 0; i < k.got.size(); ++i) {
        const double e = std::fabs(k.got[i] - k.ref[i]), unit = kBf16 * k.scale[i];
        EXPECT_LE(e, (kSlack + static_cast<double>(k.terms)) * unit) << k.name << " element " << i;
        if (unit > 0 && e / unit > worst) worst = e / unit, at = i;
        if (unit == 0) EXPECT_EQ(k.got[i], k.ref[i]) << k.name << " element " << i;
      }
      EXPECT_LE(worst, kSlack) << k.name << ": worst at " << at << ", got " << k.got[at] << ", want " << k.ref[at];
    }
  }
}

// Fused and unfused attention with dropout: the same function within the class bound, in f32
// and with bf16 activations (16-bit qkv, out and gradients).
TEST_P(FlashAttention, MatchesUnfusedWithDropout) {
  for (const Case& c : kCases)
    for (DType dtype : {DType::F32, DType::BF16}) {
      SCOPED_TRACE(describe(c) + " " + std::string(dtype_name(dtype)));
      const int64_t NH = c.NH(), T = c.T, HD = c.HD;
      // Heads 1.. of 4 more: this shard's mask starts at element_offset, as on a TP rank.
      const ops::Dropout drop = dropout_of(0.25f, static_cast<uint64_t>(NH * T * T));
      Tensor qkv = values(dtype, {c.B, T, c.qkv_row()}, normal(c.B * T * c.qkv_row()));
      Tensor dout = values(dtype, {c.B, T, NH * HD}, normal(c.B * T * NH * HD));
      const std::vector<float> prefill = normal(qkv.numel());
      Tensor out = zeros(dtype, {c.B, T, NH * HD}), lse = zeros(DType::F32, {c.B, NH, T});
      ops::flash_attention_forward(out, lse, qkv, Tensor(), c.NG, c.rope(), drop, {});
      Tensor dqkv = values(dtype, qkv.shape, prefill);
      Tensor scratch = zeros(DType::F32, ops::flash_attention_scratch(device(), c.B, NH, T));
      ops::flash_attention_backward(dqkv, Tensor(), scratch, dout, qkv, Tensor(), out, lse, c.NG, c.rope(), drop, {});

      Unfused u = unfused_forward(c, dtype, qkv, drop);
      Tensor dqkv_unfused = values(dtype, qkv.shape, prefill);
      unfused_backward(c, dtype, u, dqkv_unfused, dout, drop);
      // f32: two orders of the same f32 sums (dropped elements scale by 4/3 either way):
      // measured <= 2.4e-7 (out), 1e-6 (dqkv).
      // bf16: each output rounded once to bf16 (2^-9 relative) on both sides, so the two can
      // differ by one bf16 ulp where their f32 values straddle a rounding boundary; the
      // unfused path also rounds the probabilities, the per-head [q;k;v] copy and its gradient
      // to bf16, the fused never does: measured 5.9e-3 (out), 1.3e-2 (dqkv).
      const bool f32 = dtype == DType::F32;
      expect_near_all("out", read(out), read(u.out), f32 ? 2e-6 : 1.6e-2);
      expect_near_all("dqkv", read(dqkv), read(dqkv_unfused), f32 ? 1e-5 : 3e-2);
    }
}

// The dropout mask itself, read out: with q = k = 0 every visible key has probability
// 1/(t+1), and with v_u the one-hot vector e_u (HD >= T) out[t, u] = factor(t, u) / (t+1).
// So out is zero exactly where the mask dropped (t, u), on both paths, element for element.
TEST_P(FlashAttention, DropsTheUnfusedOpsElements) {
  const Case c{2, 40, 2, 2, 48, 0};
  const int64_t NH = c.NH(), T = c.T, HD = c.HD;
  std::vector<float> qkv_h(static_cast<size_t>(c.B * T * c.qkv_row()), 0.0f);
  for (int64_t b = 0; b < c.B; ++b)
    for (int64_t t = 0; t < T; ++t)
      for (int64_t g = 0; g < c.NG; ++g) qkv_h[(b * T + t) * c.qkv_row() + g * (c.R + 2) * HD + (c.R + 1) * HD + t] = 1;
  const ops::Dropout drop = dropout_of(0.5f, static_cast<uint64_t>(3 * T * T));
  Tensor qkv = values(DType::F32, {c.B, T, c.qkv_row()}, qkv_h);
  Tensor out = zeros(DType::F32, {c.B, T, NH * HD}), lse = zeros(DType::F32, {c.B, NH, T});
  ops::flash_attention_forward(out, lse, qkv, Tensor(), c.NG, c.rope(), drop, {});
  const Unfused u = unfused_forward(c, DType::F32, qkv, drop);
  const std::vector<float> fused = read(out), unfused = read(u.out);
  int64_t kept = 0, dropped = 0;
  for (int64_t b = 0; b < c.B; ++b)
    for (int64_t h = 0; h < NH; ++h)
      for (int64_t t = 0; t < T; ++t)
        for (int64_t k = 0; k <= t; ++k) {
          const size_t i = static_cast<size_t>((b * T + t) * NH * HD + h * HD + k);
          ASSERT_EQ(fused[i] == 0.0f, unfused[i] == 0.0f) << "b " << b << " head " << h << " query " << t << " key " << k;
          (fused[i] == 0.0f ? dropped : kept) += 1;
          if (fused[i] != 0.0f) EXPECT_NEAR(fused[i], 2.0 / (t + 1), 1e-6);
        }
  // p = 0.5 over 6560 elements: both kinds occur (else the comparison proves nothing).
  EXPECT_GT(kept, 1000);
  EXPECT_GT(dropped, 1000);
}

std::string test_name(const ::testing::TestParamInfo<std::string>& info) {
  std::string name = info.param;
  for (char& ch : name)
    if (ch == ':') ch = '_';
  return name;
}

// Block pairs (ops.h AttentionBlock): the sequence split as context parallelism splits it (2·CP
// chunks, rank r holding chunks r and 2·CP−1−r), each rank's queries run against every rank's
// keys, one block per call, merged by the log-sum-exp in ring order (own block first); the
// backward's blocks add up likewise (dq into the rank's own dqkv, dk and dv into the key
// owner's). Out, lse and dqkv equal the whole sequence's in one call, dropout on (the element
// index is the true positions', so the same probabilities drop).
TEST_P(FlashAttention, BlockPairsOfASplitSequenceAddUpToTheWhole) {
  // GQA with rope, 2 and 4 ranks: chunks of 34 and 17 rows (not whole tiles).
  for (int cp : {2, 4}) {
    const Case c{2, 136, 2, 2, 16, 8};
    SCOPED_TRACE(describe(c) + " cp " + std::to_string(cp));
    const int64_t NH = c.NH(), S = c.T, HD = c.HD, W = c.qkv_row(), Tl = S / cp, C = S / (2 * cp);
    const ops::Dropout drop = dropout_of(0.1f, 0);
    const std::vector<float> qkv_h = normal(c.B * S * W), dout_h = normal(c.B * S * NH * HD);
    Tensor qkv = values(DType::F32, {c.B, S, W}, qkv_h), dout = values(DType::F32, {c.B, S, NH * HD}, dout_h);
    Tensor out = zeros(DType::F32, {c.B, S, NH * HD}), lse = zeros(DType::F32, {c.B, NH, S});
    Tensor dqkv = zeros(DType::F32, qkv.shape);
    Tensor scratch = zeros(DType::F32, ops::flash_attention_scratch(device(), c.B, NH, S));
    ops::flash_attention_forward(out, lse, qkv, Tensor(), c.NG, c.rope(), drop, {});
    ops::flash_attention_backward(dqkv, Tensor(), scratch, dout, qkv, Tensor(), out, lse, c.NG, c.rope(), drop, {});
    const std::vector<float> out_w = read(out), lse_w = read(lse), dqkv_w = read(dqkv);

    auto rows_of = [&](int r) { return ops::SequenceRows{C, r * C, (2 * cp - 1 - r) * C}; };
    // Rank r's rows of a whole [B,S,width] host array.
    auto local = [&](const std::vector<float>& whole, int r, int64_t width) {
      std::vector<float> v;
      for (int64_t b = 0; b < c.B; ++b)
        for (int64_t t = 0; t < Tl; ++t) {
          const float* row = whole.data() + (b * S + rows_of(r).position(t)) * width;
          v.insert(v.end(), row, row + width);
        }
      return v;
    };
    std::vector<Tensor> q(cp), go(cp), o(cp), l(cp), dq(cp), dkv(cp);
    for (int r = 0; r < cp; ++r) {
      q[r] = values(DType::F32, {c.B, Tl, W}, local(qkv_h, r, W));
      go[r] = values(DType::F32, {c.B, Tl, NH * HD}, local(dout_h, r, NH * HD));
      o[r] = zeros(DType::F32, {c.B, Tl, NH * HD}), l[r] = zeros(DType::F32, {c.B, NH, Tl});
      dq[r] = zeros(DType::F32, {c.B, Tl, W}), dkv[r] = zeros(DType::F32, {c.B, Tl, W});
    }
    Tensor part_scratch = zeros(DType::F32, ops::flash_attention_scratch(device(), c.B, NH, Tl));
    for (int r = 0; r < cp; ++r)
      for (int i = 0; i < cp; ++i) {  // ring order: the own block, then r-1, r-2, ...
        const int src = (r - i + cp) % cp;
        ops::flash_attention_forward(o[r], l[r], q[r], i == 0 ? Tensor() : q[src], c.NG, c.rope(), drop,
                                     {S, rows_of(r), rows_of(src), i > 0});
      }
    for (int r = 0; r < cp; ++r)
      for (int i = 0; i < cp; ++i) {
        const int src = (r - i + cp) % cp;
        ops::flash_attention_backward(dq[r], i == 0 ? Tensor() : dkv[src], part_scratch, go[r], q[r],
                                      i == 0 ? Tensor() : q[src], o[r], l[r], c.NG, c.rope(), drop,
                                      {S, rows_of(r), rows_of(src), false});
      }
    for (int r = 0; r < cp; ++r) {
      SCOPED_TRACE("rank " + std::to_string(r));
      // Rank r's lse rows [B,NH,Tl] of the whole [B,NH,S].
      std::vector<float> lse_r;
      for (int64_t bh = 0; bh < c.B * NH; ++bh)
        for (int64_t t = 0; t < Tl; ++t) lse_r.push_back(lse_w[bh * S + rows_of(r).position(t)]);
      std::vector<float> d = read(dq[r]);
      const std::vector<float> k = read(dkv[r]);
      for (size_t e = 0; e < d.size(); ++e) d[e] += k[e];
      // The same sums as the whole call's, split at other tile boundaries and merged: a few
      // f32 roundings more (measured <= 4e-7 and 1.5e-6).
      expect_near_all("out", read(o[r]), local(out_w, r, NH * HD), 2e-6);
      expect_near_all("lse", read(l[r]), lse_r, 2e-6);
      expect_near_all("dqkv", d, local(dqkv_w, r, W), 1e-5);
    }
  }
}

// attention_kv_pack/unpack (what the context-parallel ring sends): the k and v columns of
// each group, element for element, in bf16 and f32; unpack leaves the q columns as they were,
// and its accumulating form adds in f32 with one rounding (exact here: sums of f32 values).
TEST_P(FlashAttention, KeysAndValuesPackAndUnpack) {
  for (const Case& c : {Case{2, 5, 3, 2, 4, 0}, Case{1, 3, 2, 1, 8, 0}})
    for (DType dtype : {DType::F32, DType::BF16}) {
      SCOPED_TRACE(describe(c) + " " + std::string(dtype_name(dtype)));
      const int64_t HD = c.HD, W = c.qkv_row(), KW = c.NG * 2 * HD, rows = c.B * c.T;
      Tensor qkv = values(dtype, {c.B, c.T, W}, normal(rows * W)), kv = zeros(dtype, {c.B, c.T, KW});
      ops::attention_kv_pack(kv, qkv, c.NG);
      const std::vector<float> q = read(qkv), k = read(kv);
      // Element c of group g's key-value run of a row, in the two layouts.
      auto wide = [&](int64_t row, int64_t g, int64_t e) { return row * W + g * (c.R + 2) * HD + c.R * HD + e; };
      auto packed = [&](int64_t row, int64_t g, int64_t e) { return row * KW + g * 2 * HD + e; };
      for (int64_t row = 0; row < rows; ++row)
        for (int64_t g = 0; g < c.NG; ++g)
          for (int64_t e = 0; e < 2 * HD; ++e) ASSERT_EQ(k[packed(row, g, e)], q[wide(row, g, e)]);

      const std::vector<float> prefill = normal(rows * W);
      Tensor target = values(dtype, qkv.shape, prefill);
      const std::vector<float> before = read(target);
      ops::attention_kv_unpack(target, kv, c.NG, ops::GradWrite::Assign);
      std::vector<float> want = before;
      for (int64_t row = 0; row < rows; ++row)
        for (int64_t g = 0; g < c.NG; ++g)
          for (int64_t e = 0; e < 2 * HD; ++e) want[wide(row, g, e)] = k[packed(row, g, e)];
      EXPECT_EQ(read(target), want);
      if (dtype != DType::F32) continue;
      ops::attention_kv_unpack(target, kv, c.NG, ops::GradWrite::Accumulate);
      for (int64_t row = 0; row < rows; ++row)
        for (int64_t g = 0; g < c.NG; ++g)
          for (int64_t e = 0; e < 2 * HD; ++e) want[wide(row, g, e)] += k[packed(row, g, e)];
      EXPECT_EQ(read(target), want);
    }
}

// A block whose keys all come after its queries adds nothing; a block pair's contract is
// checked: kv of another shape, positions outside the sequence.
TEST_P(FlashAttention, BlockPairsMaskByTruePositions) {
  const Case c{1, 8, 1, 1, 8, 0};
  const int64_t NH = c.NH(), HD = c.HD, W = c.qkv_row();
  Tensor qkv = values(DType::F32, {1, 8, W}, normal(8 * W)), kv = values(DType::F32, {1, 8, W}, normal(8 * W));
  Tensor out = values(DType::F32, {1, 8, NH * HD}, normal(8 * NH * HD)), lse = zeros(DType::F32, {1, NH, 8});
  const std::vector<float> before = read(out), lse_before = read(lse);
  // queries at positions 0..7, keys at 8..15 of a sequence of 16: nothing visible, merge keeps all
  ops::flash_attention_forward(out, lse, qkv, kv, c.NG, c.rope(), {}, {16, {0, 0, 0}, {0, 8, 0}, true});
  EXPECT_EQ(read(out), before);
  EXPECT_EQ(read(lse), lse_before);
  // written instead of merged: rows that see no key are 0 with lse -inf
  ops::flash_attention_forward(out, lse, qkv, kv, c.NG, c.rope(), {}, {16, {0, 0, 0}, {0, 8, 0}, false});
  for (float v : read(out)) EXPECT_EQ(v, 0.0f);
  for (float v : read(lse)) EXPECT_TRUE(std::isinf(v) && v < 0);
}

INSTANTIATE_TEST_SUITE_P(Backends, FlashAttention, ::testing::ValuesIn(backends_with_flash_attention()), test_name);

// Shape errors name the op and the shapes (internal checks: they abort, as attention_qkv's).
TEST(FlashAttentionDeathTest, RejectsMismatchedShapes) {
  using namespace tessera::ops_test;
  Arena arena;
  Tensor qkv = arena.f32({1, 5, 2 * 4 * 8}), out = arena.f32({1, 5, 4 * 8}), lse = arena.f32({1, 4, 5});
  EXPECT_DEATH(ops::flash_attention_forward(out, lse, qkv, Tensor(), 3, {}, {}, {}), "with 3 query groups");  // 4 heads, 3 groups
  EXPECT_DEATH(ops::flash_attention_forward(out, lse, qkv, Tensor(), 1, {}, {}, {}), "width is not");  // 64 wide, 1 group wants 48
  EXPECT_DEATH(ops::flash_attention_forward(out, lse, qkv, Tensor(), 2, {.dim = 10}, {}, {}), "rope dim 10");  // above HD 8
  ops::flash_attention_forward(out, lse, qkv, Tensor(), 2, {}, {}, {});  // 2 groups of 2 heads: 64 wide
}

// ---- finite differences (CPU: the loss perturbs host memory) -----------------------------

TEST(FlashAttentionGradients, MatchFiniteDifferences) {
  using namespace tessera::ops_test;
  for (const Case& c : {Case{1, 6, 2, 2, 4, 4}, Case{2, 5, 2, 1, 4, 0}}) {
    SCOPED_TRACE(describe(c));
    Arena arena;
    const int64_t NH = c.NH(), T = c.T, HD = c.HD;
    Tensor qkv = arena.normal({c.B, T, c.qkv_row()}, 1), R = arena.normal({c.B, T, NH * HD}, 2);
    Tensor out = arena.f32({c.B, T, NH * HD}), lse = arena.f32({c.B, NH, T});
    Tensor scratch = arena.f32(ops::flash_attention_scratch(cpu_device(), c.B, NH, T));
    // With dropout too: the mask is a function of the element, the same in every call.
    for (float p : {0.0f, 0.3f}) {
      const ops::Dropout drop = dropout_of(p);
      ops::flash_attention_forward(out, lse, qkv, Tensor(), c.NG, c.rope(), drop, {});
      Grad dqkv(arena, qkv, 3);
      ops::flash_attention_backward(dqkv.t, Tensor(), scratch, R, qkv, Tensor(), out, lse, c.NG, c.rope(), drop, {});
      const auto loss = [&] {
        ops::flash_attention_forward(out, lse, qkv, Tensor(), c.NG, c.rope(), drop, {});
        return weighted_sum(out, R);
      };
      // eps 1e-2 on O(1) inputs: the loss sums ~100 outputs of O(1) times O(1) weights, each
      // rounded in f32, so it carries ~3e-7 of noise, ~2e-5 on the difference quotient
      // (at eps 1e-3 that was ~2e-4, as much as the bound: any reordering of the forward's
      // sums moved elements across it); curvature error ~eps^2 = 1e-4 relative.
      expect_gradient("dqkv", qkv, dqkv, loss, 1e-2f, 3e-4, 3e-3);
    }
  }
}

}  // namespace
