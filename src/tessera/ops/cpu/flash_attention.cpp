// Fused causal self-attention on the CPU (ops.h flash_attention_*): FlashAttention-2's
// algorithm (Dao 2023) in tiles of kTile queries by kTile keys, never holding a T x T matrix.
// Legend: B batch, T sequence, NG query groups, R = NH/NG query heads per group, NH heads,
// HD head dim (HDp: padded to a whole vector), half = rope.dim / 2;
//   qkv, dqkv [B,T,NG*(R+2)*HD] Megatron's grouped layout (group g: R queries, key, value);
//   out, dout [B,T,NH*HD]; lse [B,NH,T]; scratch [B,NH,T] (the backward's D = rowsum(dout*out)).
// Tiles are staged in f32 (any storage dtype; q and k rotated by RoPE and q scaled by
// 1/sqrt(HD) as they are loaded, padded with zeros to whole tiles and vectors) and multiplied
// by flash_attention_tile.h's register-blocked product.
// Forward: one work item per (b, head, query tile), key tiles up to the diagonal only, an
// online softmax (running max and denominator per row, the partial output rescaled when the
// max grows). Backward: one work item per (b, group), owning every column of its group in
// dqkv: the group's K and V are loaded once for its R heads, and for each head, key tile and
// query tile at or below the diagonal the probabilities are recomputed from lse, then dV, dS,
// dQ and dK follow. Dropout factors come from dropout_mask.h with attention_forward's element
// index, so both kernels drop the same probabilities.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <utility>

#include "tessera/ops/cpu/cpu_ops.h"
#include "tessera/ops/cpu/dropout_mask.h"
#include "tessera/ops/cpu/fast_math.h"
#include "tessera/ops/cpu/flash_attention_tile.h"
#include "tessera/ops/cpu/rope_rotation.h"
#include "tessera/ops/cpu/shape_checks.h"
#include "tessera/ops/cpu/storage.h"

namespace tessera::ops::cpu {
namespace {

using flash::kVec;
using flash::tile_product;

constexpr int64_t kTile = 64;  // queries and keys per tile

int64_t round_up(int64_t n, int64_t m) { return (n + m - 1) / m * m; }

// flash_layout's sizes, with the padded ones of the tiles.
struct FlashDims : FlashLayout {
  int64_t HDp;  // HD rounded up to whole vectors
  int64_t tiles() const { return (T + kTile - 1) / kTile; }
  int64_t Tp() const { return tiles() * kTile; }
};

FlashDims flash_dims(const Tensor& qkv, const Tensor& out, const Tensor& lse, int64_t num_groups, const Rope& rope,
                     const char* op) {
  const FlashLayout l = flash_layout(qkv, out, lse, num_groups, rope, op);
  return {l, round_up(l.HD, kVec)};
}

// The cos/sin rows of position t in rope_table's table (nullptr without RoPE).
struct Angles {
  const float* table;
  int64_t T, half;
  const float* cos(int64_t t) const { return table + t * half; }
  const float* sin(int64_t t) const { return table + T * half + t * half; }
};

// dst[r*HDp + i], r < rows (rows < pad_rows zero-padded, and columns HD..HDp): the HD columns
// at element `off` of rows t0 + r of `t` (row stride ld), rotated by the angles of position
// t0 + r when `rotated` and RoPE is on, times scale. tmp: rows * HD floats.
void load_head(float* dst, int64_t pad_rows, const Tensor& t, int64_t off, int64_t ld, int64_t t0, int64_t rows,
               const FlashDims& d, const Angles& angles, bool rotated, float scale, float* tmp) {
  const int64_t HD = d.HD, HDp = d.HDp;
  widen(tmp, t, off, rows, HD, ld);
  for (int64_t r = 0; r < rows; ++r) {
    float* y = dst + r * HDp;
    const float* x = tmp + r * HD;
    if (rotated && angles.table)
      rotate<false>(y, x, angles.cos(t0 + r), angles.sin(t0 + r), 1.0f, d.half, HD);
    else
      std::memcpy(y, x, static_cast<size_t>(HD) * sizeof(float));
    if (scale != 1.0f) {
#pragma omp simd
      for (int64_t i = 0; i < HD; ++i) y[i] *= scale;
    }
    std::fill(y + HD, y + HDp, 0.0f);
  }
  std::fill(dst + rows * HDp, dst + pad_rows * HDp, 0.0f);
}

// dstT[i*ldt + r] = src[r*HDp + i] for r < rows, i < HDp. Eight destination rows at a time:
// row by row over all of them, a store per row ldt floats apart, would keep every line of a
// 4 KB-strided column in one L1 set and evict them before their next element.
void transpose_tile(float* dstT, int64_t ldt, const float* src, int64_t rows, int64_t HDp) {
  constexpr int64_t kRows = 8;  // HDp is a multiple of kVec, so of 8
  for (int64_t i0 = 0; i0 < HDp; i0 += kRows)
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t i = i0; i < i0 + kRows; ++i) dstT[i * ldt + r] = src[r * HDp + i];
}

// Rows t0 + r (r < rows) of the HD columns at element `off` of t (row stride ld) += src rows
// (stride HDp) rotated back (the transposed rotation) when `rotated`; rounded once.
void add_head(const Tensor& t, int64_t off, int64_t ld, int64_t t0, int64_t rows, const float* src,
              const FlashDims& d, const Angles& angles, bool rotated, float* tmp) {
  const int64_t HD = d.HD;
  widen(tmp, t, off, rows, HD, ld);
  for (int64_t r = 0; r < rows; ++r) {
    if (rotated && angles.table)
      rotate<true>(tmp + r * HD, src + r * d.HDp, angles.cos(t0 + r), angles.sin(t0 + r), -1.0f, d.half, HD);
    else
      rotate<true>(tmp + r * HD, src + r * d.HDp, nullptr, nullptr, 1.0f, 0, HD);
  }
  narrow(t, off, ld, tmp, HD, rows, HD);
}

// The first key of tile k0 that query t may not see, counted from k0 (t >= k0 for every tile
// a query reaches).
int64_t visible_keys(int64_t t, int64_t k0, int64_t kn) { return std::min(kn, t - k0 + 1); }

// The keys (transposed, as the score product reads them) and values of one (b, group), the
// whole sequence: a thread loads them once and reuses them for every query tile it runs of
// the group's heads (work items run head by head), instead of loading and transposing a key
// tile per tile pair.
struct KeyValues {
  int64_t b = -1, g = -1;
  float *kt, *v, *k;  // kt [HDp, Tp]; v [Tp, HDp]; k: staging for kt [Tp, HDp]
  static size_t floats(const FlashDims& d) { return 3 * d.Tp() * d.HDp; }
  explicit KeyValues(float* p, const FlashDims& d) : kt(p), v(p + d.Tp() * d.HDp), k(v + d.Tp() * d.HDp) {}
  // tmp: T * HD floats.
  void load(const Tensor& qkv, const FlashDims& d, const Angles& angles, int64_t b_, int64_t g_, float* tmp) {
    if (b_ == b && g_ == g) return;
    b = b_, g = g_;
    const int64_t row = d.qkv_row(), Tp = d.Tp();
    load_head(k, Tp, qkv, b * d.T * row + d.k_col(g), row, 0, d.T, d, angles, true, 1.0f, tmp);
    transpose_tile(kt, Tp, k, Tp, d.HDp);
    load_head(v, Tp, qkv, b * d.T * row + d.v_col(g), row, 0, d.T, d, angles, false, 1.0f, tmp);
  }
};

struct ForwardBuffers {
  float *q, *s, *o, *m, *l, *f, *tmp;
  KeyValues kv;
  static size_t floats(const FlashDims& d) {
    return 2 * kTile * d.HDp + kTile * kTile + 3 * kTile + d.Tp() * d.HDp + KeyValues::floats(d);
  }
  ForwardBuffers(float* p, const FlashDims& d)
      : q(p), s(q + kTile * d.HDp), o(s + kTile * kTile), m(o + kTile * d.HDp), l(m + kTile), f(l + kTile),
        tmp(f + kTile), kv(tmp + d.Tp() * d.HDp, d) {}
};

// Query tile qi of head h of sample b.
void forward_tile(Tensor out, float* lse, const Tensor& qkv, const FlashDims& d, const Angles& angles,
                  const Dropout& dropout, int64_t b, int64_t h, int64_t qi, ForwardBuffers& w) {
  const int64_t T = d.T, HD = d.HD, HDp = d.HDp, Tp = d.Tp(), row = d.qkv_row();
  const int64_t q0 = qi * kTile, qn = std::min(kTile, T - q0);
  const float scale = 1.0f / std::sqrt(static_cast<float>(HD));
  const bool drop = dropout.p > 0.0f;
  w.kv.load(qkv, d, angles, b, h / d.R, w.tmp);
  load_head(w.q, kTile, qkv, (b * T + q0) * row + d.q_col(h), row, q0, qn, d, angles, true, scale, w.tmp);
  std::fill(w.o, w.o + kTile * HDp, 0.0f);
  std::fill(w.m, w.m + kTile, -std::numeric_limits<float>::infinity());
  std::fill(w.l, w.l + kTile, 0.0f);
  for (int64_t k0 = 0; k0 < q0 + qn; k0 += kTile) {
    const int64_t kn = std::min(kTile, T - k0);
    tile_product<false>(w.s, kTile, w.q, HDp, 1, w.kv.kt + k0, Tp, qn, kTile, HD);
    for (int64_t i = 0; i < qn; ++i) {
      const int64_t t = q0 + i, n = visible_keys(t, k0, kn);
      float* s = w.s + i * kTile;
      float mx = w.m[i];
#pragma omp simd reduction(max : mx)
      for (int64_t j = 0; j < n; ++j) mx = s[j] > mx ? s[j] : mx;
      const float correction = exp_approx(w.m[i] - mx);
      float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
      for (int64_t j = 0; j < kTile; ++j) {
        const float e = j < n ? exp_approx(s[j] - mx) : 0.0f;
        s[j] = e;
        sum += e;
      }
      w.m[i] = mx;
      w.l[i] = w.l[i] * correction + sum;
      float* o = w.o + i * HDp;
#pragma omp simd
      for (int64_t c = 0; c < HDp; ++c) o[c] *= correction;
      if (drop) {  // element (h*T + t)*T + key of the sample, as attention_forward's
        dropout_factors(dropout, b, static_cast<uint64_t>((h * T + t) * T + k0), n, w.f);
#pragma omp simd
        for (int64_t j = 0; j < n; ++j) s[j] *= w.f[j];
      }
    }
    tile_product<true>(w.o, HDp, w.s, kTile, 1, w.kv.v + k0 * HDp, HDp, qn, HDp, kn);
  }
  for (int64_t i = 0; i < qn; ++i) {
    const float inv = 1.0f / w.l[i];
    float* o = w.o + i * HDp;
#pragma omp simd
    for (int64_t c = 0; c < HDp; ++c) o[c] *= inv;
    lse[(b * d.NH + h) * T + q0 + i] = w.m[i] + std::log(w.l[i]);
  }
  narrow(out, (b * T + q0) * d.out_row() + h * HD, d.out_row(), w.o, HDp, qn, HD);
}

// Per-thread buffers of the backward of one (b, group): whole-sequence f32 copies.
struct BackwardBuffers {
  float *k, *v, *kt, *vt, *dk, *dv, *q, *dout, *dq, *s, *dp, *f, *tmp;
  static size_t floats(const FlashDims& d) {
    return 10 * d.Tp() * d.HDp + 2 * kTile * kTile + kTile;
  }
  BackwardBuffers(float* p, const FlashDims& d) {
    const int64_t n = d.Tp() * d.HDp;
    k = p, v = k + n, kt = v + n, vt = kt + n, dk = vt + n, dv = dk + n, q = dv + n, dout = q + n, dq = dout + n;
    tmp = dq + n, s = tmp + n, dp = s + kTile * kTile, f = dp + kTile * kTile;
  }
};

// One head h's contributions: dq into dqkv, dk and dv into the group's accumulators.
void backward_head(Tensor dqkv, float* D, const float* lse, const Tensor& dout, const Tensor& qkv, const Tensor& out,
                   const FlashDims& d, const Angles& angles, const Dropout& dropout, int64_t b, int64_t h,
                   BackwardBuffers& w) {
  const int64_t T = d.T, HD = d.HD, HDp = d.HDp, Tp = d.Tp(), row = d.qkv_row(), orow = d.out_row();
  const float scale = 1.0f / std::sqrt(static_cast<float>(HD));
  const bool drop = dropout.p > 0.0f;
  load_head(w.q, Tp, qkv, b * T * row + d.q_col(h), row, 0, T, d, angles, true, scale, w.tmp);
  load_head(w.dout, Tp, dout, b * T * orow + h * HD, orow, 0, T, d, angles, false, 1.0f, w.tmp);
  load_head(w.dq, Tp, out, b * T * orow + h * HD, orow, 0, T, d, angles, false, 1.0f, w.tmp);
  for (int64_t t = 0; t < T; ++t) {
    float sum = 0.0f;
    const float *g = w.dout + t * HDp, *o = w.dq + t * HDp;
#pragma omp simd reduction(+ : sum)
    for (int64_t c = 0; c < HDp; ++c) sum += g[c] * o[c];
    D[t] = sum;
  }
  std::fill(w.dq, w.dq + Tp * HDp, 0.0f);
  for (int64_t k0 = 0; k0 < T; k0 += kTile) {
    const int64_t kn = std::min(kTile, T - k0);
    for (int64_t q0 = k0; q0 < T; q0 += kTile) {
      const int64_t qn = std::min(kTile, T - q0);
      tile_product<false>(w.s, kTile, w.q + q0 * HDp, HDp, 1, w.kt + k0, Tp, qn, kTile, HD);
      tile_product<false>(w.dp, kTile, w.dout + q0 * HDp, HDp, 1, w.vt + k0, Tp, qn, kTile, HD);
      for (int64_t i = 0; i < qn; ++i) {
        const int64_t t = q0 + i, n = visible_keys(t, k0, kn);
        float *s = w.s + i * kTile, *dp = w.dp + i * kTile;
        const float m = lse[t], Dt = D[t];
        if (drop) dropout_factors(dropout, b, static_cast<uint64_t>((h * T + t) * T + k0), n, w.f);
        // s becomes the (dropped-out) probabilities a' for dV, dp the score gradients dS.
#pragma omp simd
        for (int64_t j = 0; j < kTile; ++j) {
          const float p = j < n ? exp_approx(s[j] - m) : 0.0f;
          const float factor = drop && j < n ? w.f[j] : 1.0f;
          s[j] = p * factor;
          dp[j] = p * (dp[j] * factor - Dt);
        }
      }
      tile_product<true>(w.dv + k0 * HDp, HDp, w.s, 1, kTile, w.dout + q0 * HDp, HDp, kn, HDp, qn);
      tile_product<true>(w.dq + q0 * HDp, HDp, w.dp, kTile, 1, w.k + k0 * HDp, HDp, qn, HDp, kn);
      tile_product<true>(w.dk + k0 * HDp, HDp, w.dp, 1, kTile, w.q + q0 * HDp, HDp, kn, HDp, qn);
    }
  }
#pragma omp simd
  for (int64_t e = 0; e < T * HDp; ++e) w.dq[e] *= scale;  // scores are scale * q.k
  add_head(dqkv, b * T * row + d.q_col(h), row, 0, T, w.dq, d, angles, true, w.tmp);
}

void backward_group(Tensor dqkv, float* scratch, const float* lse, const Tensor& dout, const Tensor& qkv,
                    const Tensor& out, const FlashDims& d, const Angles& angles, const Dropout& dropout, int64_t b,
                    int64_t g, BackwardBuffers& w) {
  const int64_t T = d.T, HDp = d.HDp, Tp = d.Tp(), row = d.qkv_row();
  load_head(w.k, Tp, qkv, b * T * row + d.k_col(g), row, 0, T, d, angles, true, 1.0f, w.tmp);
  load_head(w.v, Tp, qkv, b * T * row + d.v_col(g), row, 0, T, d, angles, false, 1.0f, w.tmp);
  transpose_tile(w.kt, Tp, w.k, Tp, HDp);
  transpose_tile(w.vt, Tp, w.v, Tp, HDp);
  std::fill(w.dk, w.dk + Tp * HDp, 0.0f);
  std::fill(w.dv, w.dv + Tp * HDp, 0.0f);
  for (int64_t h = g * d.R; h < (g + 1) * d.R; ++h)
    backward_head(dqkv, scratch + (b * d.NH + h) * T, lse + (b * d.NH + h) * T, dout, qkv, out, d, angles, dropout,
                  b, h, w);
  add_head(dqkv, b * T * row + d.k_col(g), row, 0, T, w.dk, d, angles, true, w.tmp);
  add_head(dqkv, b * T * row + d.v_col(g), row, 0, T, w.dv, d, angles, false, w.tmp);
}

float* thread_buffer(size_t floats) {
  return static_cast<float*>(workspace(Workspace::ExpandA, floats * sizeof(float)));
}

}  // namespace

void flash_attention_forward(Tensor out, Tensor lse, Tensor qkv, int64_t num_groups, const Rope& rope,
                             const Dropout& dropout) {
  const FlashDims d = flash_dims(qkv, out, lse, num_groups, rope, "flash_attention_forward");
  check_float(out, "flash_attention_forward", "out");
  check_float(qkv, "flash_attention_forward", "qkv");
  float* lse_p = f32_arg(lse, "flash_attention_forward", "lse");
  if (dropout.p > 0.0f) dropout_scale(dropout);  // checks p
  const Angles angles{rope_table(d.T, d.half, rope), d.T, d.half};
  const int64_t tiles = d.tiles(), items = d.B * d.NH * tiles;
#pragma omp parallel
  {
    ForwardBuffers w(thread_buffer(ForwardBuffers::floats(d)), d);
    // Head by head (so a thread's keys and values serve its next items), within a head the
    // longest items (query tiles near the end see the most keys) first.
#pragma omp for schedule(dynamic, 1)
    for (int64_t item = 0; item < items; ++item) {
      const int64_t bh = item / tiles, qi = tiles - 1 - item % tiles;
      forward_tile(out, lse_p, qkv, d, angles, dropout, bh / d.NH, bh % d.NH, qi, w);
    }
  }
}

void flash_attention_backward(Tensor dqkv, Tensor scratch, Tensor dout, Tensor qkv, Tensor out, Tensor lse,
                              int64_t num_groups, const Rope& rope, const Dropout& dropout) {
  if (dqkv.empty()) return;
  const FlashDims d = flash_dims(qkv, out, lse, num_groups, rope, "flash_attention_backward");
  check_flash_backward(dqkv, scratch, dout, qkv, out, lse);
  for (auto [t, name] : {std::pair{&dqkv, "dqkv"}, {&dout, "dout"}, {&qkv, "qkv"}, {&out, "out"}})
    check_float(*t, "flash_attention_backward", name);
  const float* lse_p = f32_arg(lse, "flash_attention_backward", "lse");
  float* scratch_p = f32_arg(scratch, "flash_attention_backward", "scratch");
  if (dropout.p > 0.0f) dropout_scale(dropout);
  const Angles angles{rope_table(d.T, d.half, rope), d.T, d.half};
#pragma omp parallel
  {
    BackwardBuffers w(thread_buffer(BackwardBuffers::floats(d)), d);
#pragma omp for schedule(dynamic, 1)
    for (int64_t bg = 0; bg < d.B * d.NG; ++bg)
      backward_group(dqkv, scratch_p, lse_p, dout, qkv, out, d, angles, dropout, bg / d.NG, bg % d.NG, w);
  }
}

// D = rowsum(dout * out) per row, f32.
Shape flash_attention_scratch(const Device&, int64_t B, int64_t NH, int64_t T) { return {B, NH, T}; }

}  // namespace tessera::ops::cpu
