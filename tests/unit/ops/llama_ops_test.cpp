// The Llama family's ops of ops.h on the CPU (rmsnorm, attention_qkv with RoPE and query
// groups, swiglu) against independent references:
// - forwards against the formulas evaluated in double: torch.nn.RMSNorm; Megatron's
//   rope_utils.py _apply_rotary_pos_emb_bshd (x cos + rotate_half(x) sin on the channels
//   [0, dim), the rest passed through) after attention.py's grouped QKV split, each query
//   head h reading the key and value of group h / (NH/NG); mlp.py's silu(gate) * up;
// - every backward against central finite differences of L = sum(out * R), gradient
//   buffers pre-filled (grad_check.h);
// - GPT's layout (NG == NH, no rotation) as a plain copy, bit for bit; shape checks as
//   death tests.
// Each tolerance sits next to its case with the reason for its size.
#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "grad_check.h"
#include "tessera/core/tensor.h"
#include "tessera/ops/ops.h"

using namespace tessera;
using namespace tessera::ops_test;

namespace {

// ---------------------------------------------------------------------------------------
// RMSNorm

TEST(OpsRmsNorm, ForwardMatchesDoubleFormula) {
  Arena arena;
  const int64_t N = 5, C = 37;  // C odd: exercises the vector loops' remainders
  Tensor inp = arena.normal({N, C}, 1, 2.0f, 1.0f), w = arena.normal({C}, 2, 0.5f, 1.0f);
  Tensor out = arena.f32({N, C}), rstd = arena.f32({N});
  const float eps = 1e-5f;
  ops::rmsnorm_forward(out, rstd, inp, w, eps);
  for (int64_t n = 0; n < N; ++n) {
    double sq = 0;
    for (int64_t c = 0; c < C; ++c) sq += static_cast<double>(inp.f32()[n * C + c]) * inp.f32()[n * C + c];
    const double rs = 1.0 / std::sqrt(sq / C + eps);
    // rstd: a float sum of 37 positive squares, ~37 * 6e-8 relative at worst, then sqrt;
    // out: that times |x w| plus two roundings.
    EXPECT_NEAR(rstd.f32()[n], rs, 3e-6 * rs);
    for (int64_t c = 0; c < C; ++c) {
      const double ref = inp.f32()[n * C + c] * rs * w.f32()[c];
      EXPECT_NEAR(out.f32()[n * C + c], ref, 4e-6 * (1 + std::fabs(ref)));
    }
  }
}

TEST(OpsRmsNorm, Gradients) {
  Arena arena;
  const int64_t N = 3, C = 11;
  Tensor inp = arena.normal({N, C}, 1, 1.0f, 0.5f), w = arena.normal({C}, 2, 0.5f, 1.0f);
  Tensor out = arena.f32({N, C}), rstd = arena.f32({N}), R = arena.normal({N, C}, 4);
  const float eps = 1e-5f;
  ops::rmsnorm_forward(out, rstd, inp, w, eps);
  Grad dinp(arena, inp, 5), dw(arena, w, 6);
  ops::rmsnorm_backward(dinp.t, dw.t, R, inp, w, rstd);
  Tensor r2 = arena.f32({N});
  auto loss = [&] {
    ops::rmsnorm_forward(out, r2, inp, w, eps);
    return weighted_sum(out, R);
  };
  // inp: as LayerNorm's check (ops_test.cpp): smooth with O(10) third derivatives at unit
  // scale, eps = 3e-3 costs ~1.5e-5 of truncation, the rounding of a row of 11 outputs over
  // 2 eps ~1e-4; the gradients are O(1).
  expect_gradient("dinp", inp, dinp, loss, 3e-3f, 1e-3, 1e-3);
  // weight: L is linear in it, only rounding remains (eps = 0.1: ~1e-6).
  expect_gradient("dweight", w, dw, loss, 0.1f, 1e-4, 1e-4);
}

TEST(OpsRmsNorm, GradientsIndependentOfThreadCount) {
  Arena arena;
  const int64_t N = 64, C = 200;
  Tensor inp = arena.normal({N, C}, 1), w = arena.normal({C}, 2), R = arena.normal({N, C}, 4);
  Tensor out = arena.f32({N, C}), rstd = arena.f32({N});
  ops::rmsnorm_forward(out, rstd, inp, w, 1e-5f);
  Tensor dw1 = arena.f32({C}), dw2 = arena.f32({C}), dx1 = arena.f32({N, C}), dx2 = arena.f32({N, C});
  const int saved = omp_get_max_threads();
  omp_set_num_threads(1);
  ops::rmsnorm_backward(dx1, dw1, R, inp, w, rstd);
  omp_set_num_threads(3);
  ops::rmsnorm_backward(dx2, dw2, R, inp, w, rstd);
  omp_set_num_threads(saved);
  EXPECT_EQ(std::memcmp(dw1.host<void>(), dw2.host<void>(), dw1.bytes()), 0);
  EXPECT_EQ(std::memcmp(dx1.host<void>(), dx2.host<void>(), dx1.bytes()), 0);
}

// ---------------------------------------------------------------------------------------
// SwiGLU

TEST(OpsSwiglu, ForwardMatchesFormula) {
  Arena arena;
  const int64_t N = 3, F = 37;
  Tensor inp = arena.uniform({N, 2 * F}, 1, -10.0f, 10.0f), out = arena.f32({N, F});
  ops::swiglu_forward(out, inp);
  for (int64_t n = 0; n < N; ++n)
    for (int64_t f = 0; f < F; ++f) {
      const double g = inp.f32()[n * 2 * F + f], u = inp.f32()[n * 2 * F + F + f];
      const double ref = g / (1 + std::exp(-g)) * u;
      // exp_approx's 2 ulp and three roundings, relative to |y|; a little absolute for the
      // negative tail where silu is tiny.
      EXPECT_NEAR(out.f32()[n * F + f], ref, 1e-6 + 1e-6 * std::fabs(ref)) << "gate " << g << " up " << u;
    }
}

TEST(OpsSwiglu, Gradients) {
  Arena arena;
  const int64_t N = 3, F = 9;
  Tensor inp = arena.uniform({N, 2 * F}, 1, -4.0f, 4.0f), out = arena.f32({N, F}), R = arena.normal({N, F}, 2);
  Grad dinp(arena, inp, 3);
  ops::swiglu_backward(dinp.t, R, inp);
  auto loss = [&] {
    ops::swiglu_forward(out, inp);
    return weighted_sum(out, R);
  };
  // Perturbing gate or up moves one output. In up it is linear; in gate silu'' <= 0.5 and
  // silu''' is O(1): eps = 1e-3 leaves ~1e-6 of truncation; an output up to ~16 rounds by
  // ~1e-6, over 2 eps ~1e-3 at worst. A wrong derivative term is off by O(0.1).
  expect_gradient("dinp", inp, dinp, loss, 1e-3f, 2e-3, 1e-3);
}

// ---------------------------------------------------------------------------------------
// attention_qkv (RoPE, query groups)

struct QkvCase {
  int64_t B, T, NG, NH, HD, dim;
  float base;
  ops::RopeScaling scaling = {};
  ops::Rope rope() const { return {dim, base, scaling}; }
};

// Megatron's inverse frequency i < dim/2 in double: 1 / base^(2i/dim), then with scaling
// (factor > 0) RotaryEmbedding._apply_scaling (rotary_pos_embedding.py) written out again:
// wavelength w = 2 pi / f; w < C / high keeps f, w > C / low gives f / factor, between them
// s = (C / w - low) / (high - low) and (1 - s) f / factor + s f.
double inv_freq_reference(const QkvCase& c, int64_t i) {
  const double f = 1.0 / std::pow(static_cast<double>(c.base), 2.0 * i / c.dim);
  const ops::RopeScaling& k = c.scaling;
  if (k.factor == 0.0f) return f;
  const double w = 2 * M_PI / f, C = k.original_max_positions;
  if (w < C / k.high_freq_factor) return f;
  if (w > C / k.low_freq_factor) return f / k.factor;
  const double s = (C / w - k.low_freq_factor) / (k.high_freq_factor - k.low_freq_factor);
  return (1 - s) * f / k.factor + s * f;
}

// out of attention_qkv_forward in double, straight from Megatron: split each grouped row
// into [q_0 .. q_{R-1}, k, v] per group, give head h the k and v of group h / R, rotate q
// and k by x cos(emb) + rotate_half(x) sin(emb) with emb = [freqs, freqs], freqs[i] =
// t * inv_freq[i] (inv_freq_reference), rotate_half(x) = [-x2, x1] on the first dim
// channels; the rest pass through.
std::vector<double> qkv_reference(const QkvCase& c, const Tensor& qkv) {
  const int64_t R = c.NH / c.NG, in_row = c.NG * (R + 2) * c.HD, out_row = c.NH * 3 * c.HD, half = c.dim / 2;
  std::vector<double> out(static_cast<size_t>(c.B * c.T * out_row));
  for (int64_t b = 0; b < c.B; ++b)
    for (int64_t t = 0; t < c.T; ++t) {
      const float* row = qkv.f32() + (b * c.T + t) * in_row;
      double* y = out.data() + (b * c.T + t) * out_row;
      for (int64_t h = 0; h < c.NH; ++h) {
        const int64_t g = h / R;
        const float* src[3] = {row + g * (R + 2) * c.HD + (h % R) * c.HD, row + g * (R + 2) * c.HD + R * c.HD,
                               row + g * (R + 2) * c.HD + (R + 1) * c.HD};
        for (int part = 0; part < 3; ++part)
          for (int64_t j = 0; j < c.HD; ++j) {
            double v = src[part][j];
            if (part < 2 && j < c.dim) {
              const double freq = t * inv_freq_reference(c, j % half);
              const double rotated_half = j < half ? -src[part][j + half] : src[part][j - half];
              v = src[part][j] * std::cos(freq) + rotated_half * std::sin(freq);
            }
            y[(h * 3 + part) * c.HD + j] = v;
          }
      }
    }
  return out;
}

Tensor qkv_input(Arena& arena, const QkvCase& c, uint32_t seed) {
  const int64_t R = c.NH / c.NG;
  return arena.normal({c.B, c.T, c.NG * (R + 2) * c.HD}, seed);
}

TEST(OpsAttentionQkv, ForwardMatchesMegatronRope) {
  const QkvCase cases[] = {
      {2, 9, 2, 6, 8, 8, 10000.0f},     // GQA, R = 3, every channel rotated
      {2, 9, 2, 4, 8, 4, 10000.0f},     // --rotary-percent 0.5: channels [4, 8) pass through
      {1, 7, 1, 4, 6, 6, 500000.0f},    // one group (MQA), Llama 3's base
      {1, 5, 3, 3, 4, 4, 10000.0f},     // NG == NH (no GQA) with rotation
      // Llama 3.1's scaling with Megatron's constants, factor 8 and 32 (Llama 3.2): of the
      // 8 frequencies of base 500000, wavelengths 6 to 861 stay, 4443 is interpolated, those
      // above 8192 are divided (at t < 40 they move the angle by ~1e-3: far above the bound).
      {1, 40, 2, 4, 16, 16, 500000.0f, {8.0f}},
      {1, 40, 2, 4, 16, 16, 500000.0f, {32.0f}},
      // A short original context, so that every region turns by whole radians: wavelengths
      // 6, 14, 31, 70 with C = 64, low 1, high 4 (kept below 16, divided above 64).
      {2, 30, 1, 2, 8, 8, 25.0f, {4.0f, 1.0f, 4.0f, 64.0f}},
  };
  for (const QkvCase& c : cases) {
    SCOPED_TRACE("NG " + std::to_string(c.NG) + " NH " + std::to_string(c.NH) + " dim " + std::to_string(c.dim) +
                 " scaling " + std::to_string(c.scaling.factor));
    Arena arena;
    Tensor qkv = qkv_input(arena, c, 1), out = arena.f32({c.B, c.T, c.NH * 3 * c.HD});
    ops::attention_qkv_forward(out, qkv, c.NG, c.rope());
    const std::vector<double> ref = qkv_reference(c, qkv);
    // The angle t * inv_freq is f32 (as Megatron's), off the double one by a few ulp of up
    // to 40 rad (~1e-5 at t = 39: inv_freq's and the product's roundings, each 6e-8
    // relative); cos, sin and the two products round once each (~1e-6 on |x| ~ 3).
    const double tol = c.T > 10 ? 1e-5 : 2e-6;
    for (int64_t i = 0; i < out.numel(); ++i)
      ASSERT_NEAR(out.f32()[i], ref[static_cast<size_t>(i)], tol * (1 + std::fabs(ref[static_cast<size_t>(i)])))
          << "element " << i;
  }
}

TEST(OpsAttentionQkv, GptLayoutIsAPlainCopy) {
  // NG == NH and no rotation: the grouped layout [q_h, k_h, v_h] is attention's own.
  Arena arena;
  const QkvCase c{2, 5, 4, 4, 6, 0, 10000.0f};
  Tensor qkv = qkv_input(arena, c, 1), out = arena.normal({c.B, c.T, c.NH * 3 * c.HD}, 2);
  ops::attention_qkv_forward(out, qkv, c.NG, {});
  EXPECT_EQ(values(out), values(qkv));
  Tensor dout = arena.normal(out.shape, 3), dqkv = arena.normal(qkv.shape, 4);
  std::vector<float> want = values(dqkv);
  for (size_t i = 0; i < want.size(); ++i) want[i] += dout.f32()[i];
  ops::attention_qkv_backward(dqkv, dout, c.NG, {});
  EXPECT_EQ(values(dqkv), want);
}

TEST(OpsAttentionQkv, Gradients) {
  const QkvCase cases[] = {{2, 5, 2, 6, 8, 6, 10000.0f},
                           {1, 4, 1, 3, 4, 4, 10000.0f},
                           {1, 30, 1, 2, 8, 8, 25.0f, {4.0f, 1.0f, 4.0f, 64.0f}}};  // scaled (above)
  for (const QkvCase& c : cases) {
    SCOPED_TRACE("NG " + std::to_string(c.NG) + " NH " + std::to_string(c.NH) + " dim " + std::to_string(c.dim));
    Arena arena;
    const ops::Rope rope = c.rope();
    Tensor qkv = qkv_input(arena, c, 1), out = arena.f32({c.B, c.T, c.NH * 3 * c.HD});
    Tensor R = arena.normal(out.shape, 2);
    Grad dqkv(arena, qkv, 3);
    ops::attention_qkv_backward(dqkv.t, R, c.NG, rope);
    auto loss = [&] {
      ops::attention_qkv_forward(out, qkv, c.NG, rope);
      return weighted_sum(out, R);
    };
    // L is linear in qkv: only the outputs' rounding (~3e-7 each, R heads reading one k)
    // over 2 eps = 0.2 remains. A missing head in dk's sum or a wrong rotation sign is off
    // by O(1).
    expect_gradient("dqkv", qkv, dqkv, loss, 0.1f, 1e-4, 1e-4);
  }
}

TEST(OpsRope, InverseFrequenciesAreMegatrons) {
  // megatron-core 0.10.0's RotaryEmbedding(kv_channels=16, rotary_base=500000) inv_freq after
  // _apply_scaling(factor=8 / 32) with its defaults (low 1, high 4, original context 8192),
  // printed with float.hex() on CPU torch 2.6: regions kept (i < 4), interpolated (4) and
  // divided (5..7).
  const float factor8[] = {0x1.000000p+0f,  0x1.8d2760p-3f,  0x1.341190p-5f,  0x1.ddee9ep-8f,
                           0x1.132ba4p-11f, 0x1.1f91f0p-15f, 0x1.be2188p-18f, 0x1.5a0f4ep-20f};
  const float factor32[] = {0x1.000000p+0f,  0x1.8d2760p-3f,  0x1.341190p-5f,  0x1.ddee9ep-8f,
                            0x1.c26c40p-12f, 0x1.1f91f0p-17f, 0x1.be2188p-20f, 0x1.5a0f4ep-22f};
  for (int i = 0; i < 8; ++i) {
    // pow may differ from torch's by an ulp; the scaling's steps add a few roundings.
    EXPECT_FLOAT_EQ(ops::rope_inv_freq({16, 500000.0f, {8.0f}}, i), factor8[i]) << i;
    EXPECT_FLOAT_EQ(ops::rope_inv_freq({16, 500000.0f, {32.0f}}, i), factor32[i]) << i;
  }
  EXPECT_EQ(ops::rope_inv_freq({16, 500000.0f}, 5), 0x1.1f91f0p-12f);  // unscaled: 8x factor 8's
}

TEST(OpsLlamaDeathTest, RejectsBadShapesAndRopeDims) {
  Arena arena;
  Tensor qkv = arena.f32({1, 2, 2 * (3 + 2) * 4}), out = arena.f32({1, 2, 6 * 3 * 4});
  EXPECT_DEATH(ops::attention_qkv_forward(out, qkv, 2, {3, 10000.0f}), "rope dim 3 must be even");
  EXPECT_DEATH(ops::attention_qkv_forward(out, qkv, 2, {6, 10000.0f}), "rope dim 6 must be even and in \\[0, 4\\]");
  EXPECT_DEATH(ops::attention_qkv_forward(out, qkv, 2, {4, 10000.0f, {8.0f, 4.0f, 1.0f, 8192.0f}}),
               "rope scaling factor 8.0+ \\(0: none\\) must be");
  EXPECT_DEATH(ops::attention_qkv_forward(arena.f32({1, 2, 70}), qkv, 2, {}), "widths are not");
  EXPECT_DEATH(ops::attention_qkv_forward(out, arena.f32({1, 3, 40}), 2, {}), "want qkv");
  EXPECT_DEATH(ops::swiglu_forward(arena.f32({2, 4}), arena.f32({2, 7})), "must be \\[N,2F\\]");
  // In place (GPT's layout has equal widths) would add dout into itself.
  Tensor same = arena.f32({1, 2, 3 * 4});
  EXPECT_DEATH(ops::attention_qkv_backward(same, same, 1, {}), "overlap");
  Tensor wide = arena.f32({2, 8});
  EXPECT_DEATH(ops::swiglu_forward(wide.view({4, 4}).slice_rows(0, 2), wide), "overlap");
}

}  // namespace
