// Fused causal self-attention on the CPU (ops.h flash_attention_*): FlashAttention-2's
// algorithm (Dao 2023) in tiles of kTile queries by kTile keys, never holding a T x T matrix.
// Legend: B batch, T sequence, NG query groups, R = NH/NG query heads per group, NH heads,
// HD head dim (HDp: padded to a whole vector), half = rope.dim / 2;
//   qkv, dqkv [B,T,NG*(R+2)*HD] Megatron's grouped layout (group g: R queries, key, value);
//   out, dout [B,T,NH*HD]; lse [B,NH,T]; scratch [B,NH,T] (the backward's D = rowsum(dout*out)).
// Tiles are staged in f32 (any storage dtype; q and k rotated by RoPE and q scaled by
// 1/sqrt(HD) as they are loaded, padded with zeros to whole tiles and vectors) and multiplied
// by flash_attention_tile.h's register-blocked product.
// Block pairs (ops.h AttentionBlock): the rows of qkv and kv sit at positions of a longer
// sequence; tiles never straddle a run of consecutive positions, and a key tile whose first
// position is after a query tile's last is skipped (the causal mask over true positions).
// Forward: one work item per (b, head, query tile), the visible key tiles only, an
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
#include <vector>

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

// A tile of a tensor's rows: n rows from row0, at consecutive positions from pos.
struct RowTile {
  int64_t row0, n, pos;
};

// The runs of consecutive positions of T rows placed by `rows` (one or two): f(row0, n, pos).
template <class F>
void for_each_run(const SequenceRows& rows, int64_t T, F f) {
  const int64_t split = rows.split == 0 ? T : rows.split;
  f(int64_t{0}, split, rows.first);
  if (split < T) f(split, T - split, rows.second);
}

// The tiles of T rows placed by `rows`: kTile rows each within a run.
std::vector<RowTile> row_tiles(const SequenceRows& rows, int64_t T) {
  std::vector<RowTile> tiles;
  for_each_run(rows, T, [&](int64_t row0, int64_t n, int64_t pos) {
    for (int64_t i = 0; i < n; i += kTile) tiles.push_back({row0 + i, std::min(kTile, n - i), pos + i});
  });
  return tiles;
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

// dstT[i*ldt + r] = src[r*HDp + i] for r < rows, i < HDp.
void transpose_tile(float* dstT, int64_t ldt, const float* src, int64_t rows, int64_t HDp) {
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t i = 0; i < HDp; ++i) dstT[i * ldt + r] = src[r * HDp + i];
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

// How many keys of a tile (kn keys from position k0) the query at position t sees: a prefix.
int64_t visible_keys(int64_t t, int64_t k0, int64_t kn) { return std::clamp<int64_t>(t - k0 + 1, 0, kn); }

// Rows [0, T) of the HD columns at element `off` of rows of sample b of t (row stride ld)
// into dst (stride HDp, rows up to Tp zeroed), each run rotated at its positions when
// `rotated`, times scale: load_head over a whole sequence placed by `rows`.
void load_rows(float* dst, int64_t Tp, const Tensor& t, int64_t off, int64_t ld, const SequenceRows& rows,
               const FlashDims& d, const Angles& angles, bool rotated, float scale, float* tmp) {
  for_each_run(rows, d.T, [&](int64_t row0, int64_t n, int64_t pos) {
    load_head(dst + row0 * d.HDp, n, t, off + row0 * ld, ld, pos, n, d, angles, rotated, scale, tmp);
  });
  std::fill(dst + d.T * d.HDp, dst + Tp * d.HDp, 0.0f);
}

// add_head over a whole sequence placed by `rows`.
void add_rows(const Tensor& t, int64_t off, int64_t ld, const SequenceRows& rows, const float* src,
              const FlashDims& d, const Angles& angles, bool rotated, float* tmp) {
  for_each_run(rows, d.T, [&](int64_t row0, int64_t n, int64_t pos) {
    add_head(t, off + row0 * ld, ld, pos, n, src + row0 * d.HDp, d, angles, rotated, tmp);
  });
}

struct ForwardBuffers {
  float *q, *k, *kt, *v, *s, *o, *m, *l, *f, *tmp;
  static size_t floats(const FlashDims& d) { return 6 * kTile * d.HDp + kTile * kTile + 3 * kTile; }
  ForwardBuffers(float* p, const FlashDims& d) {
    const int64_t tile = kTile * d.HDp;
    q = p, k = q + tile, kt = k + tile, v = kt + tile, o = v + tile, tmp = o + tile;
    s = tmp + tile, m = s + kTile * kTile, l = m + kTile, f = l + kTile;
  }
};

// Query tile qt of head h of sample b against every visible key tile of kv.
void forward_tile(Tensor out, float* lse, const Tensor& qkv, const Tensor& kv, const FlashDims& d,
                  const Angles& angles, const Dropout& dropout, const AttentionBlock& block,
                  const std::vector<RowTile>& key_tiles, int64_t b, int64_t h, const RowTile& qt, ForwardBuffers& w) {
  const int64_t T = d.T, S = block.seq_length, HD = d.HD, HDp = d.HDp, row = d.qkv_row(), g = h / d.R;
  const int64_t q0 = qt.row0, qn = qt.n;
  const float scale = 1.0f / std::sqrt(static_cast<float>(HD));
  const bool drop = dropout.p > 0.0f;
  float* lse_row = lse + (b * d.NH + h) * T + q0;
  load_head(w.q, kTile, qkv, (b * T + q0) * row + d.q_col(h), row, qt.pos, qn, d, angles, true, scale, w.tmp);
  if (block.merge) {  // the online softmax's state of the keys seen before: max lse, sum 1, output out
    load_head(w.o, kTile, out, (b * T + q0) * d.out_row() + h * HD, d.out_row(), 0, qn, d, angles, false, 1.0f,
              w.tmp);
    for (int64_t i = 0; i < qn; ++i) {
      w.m[i] = lse_row[i];
      w.l[i] = std::isinf(lse_row[i]) ? 0.0f : 1.0f;
    }
  } else {
    std::fill(w.o, w.o + kTile * HDp, 0.0f);
    std::fill(w.m, w.m + kTile, -std::numeric_limits<float>::infinity());
    std::fill(w.l, w.l + kTile, 0.0f);
  }
  for (const RowTile& kt : key_tiles) {
    if (kt.pos > qt.pos + qn - 1) continue;  // every key after every query
    const int64_t kn = kt.n;
    load_head(w.k, kTile, kv, (b * T + kt.row0) * row + d.k_col(g), row, kt.pos, kn, d, angles, true, 1.0f, w.tmp);
    transpose_tile(w.kt, kTile, w.k, kTile, HDp);
    load_head(w.v, kTile, kv, (b * T + kt.row0) * row + d.v_col(g), row, kt.pos, kn, d, angles, false, 1.0f, w.tmp);
    tile_product<false>(w.s, kTile, w.q, HDp, 1, w.kt, kTile, qn, kTile, HD);
    for (int64_t i = 0; i < qn; ++i) {
      const int64_t t = qt.pos + i, n = visible_keys(t, kt.pos, kn);
      float* s = w.s + i * kTile;
      if (n == 0) {  // nothing visible: the row's state stays
        std::fill(s, s + kTile, 0.0f);
        continue;
      }
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
      if (drop) {  // element (h*S + t)*S + key of the sample, as attention_forward's
        dropout_factors(dropout, b, static_cast<uint64_t>((h * S + t) * S + kt.pos), n, w.f);
#pragma omp simd
        for (int64_t j = 0; j < n; ++j) s[j] *= w.f[j];
      }
    }
    tile_product<true>(w.o, HDp, w.s, kTile, 1, w.v, HDp, qn, HDp, kn);
  }
  for (int64_t i = 0; i < qn; ++i) {
    const bool seen = w.l[i] > 0.0f;  // a row that saw no key: out 0, lse -inf
    const float inv = seen ? 1.0f / w.l[i] : 0.0f;
    float* o = w.o + i * HDp;
#pragma omp simd
    for (int64_t c = 0; c < HDp; ++c) o[c] *= inv;
    lse_row[i] = seen ? w.m[i] + std::log(w.l[i]) : -std::numeric_limits<float>::infinity();
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

// What every head of a backward reads besides its buffers.
struct BackwardArgs {
  Tensor dqkv;
  const float* lse;
  const Tensor &dout, &qkv, &out;
  const FlashDims& d;
  const Angles& angles;
  const Dropout& dropout;
  const AttentionBlock& block;
  const std::vector<RowTile>&query_tiles, &key_tiles;
};

// One head h's contributions: dq into dqkv, dk and dv into the group's accumulators.
void backward_head(const BackwardArgs& a, float* D, int64_t b, int64_t h, BackwardBuffers& w) {
  const FlashDims& d = a.d;
  const int64_t T = d.T, S = a.block.seq_length, HD = d.HD, HDp = d.HDp, Tp = d.Tp(), row = d.qkv_row();
  const int64_t orow = d.out_row();
  const float scale = 1.0f / std::sqrt(static_cast<float>(HD));
  const bool drop = a.dropout.p > 0.0f;
  const float* lse = a.lse + (b * d.NH + h) * T;
  load_rows(w.q, Tp, a.qkv, b * T * row + d.q_col(h), row, a.block.queries, d, a.angles, true, scale, w.tmp);
  load_head(w.dout, Tp, a.dout, b * T * orow + h * HD, orow, 0, T, d, a.angles, false, 1.0f, w.tmp);
  load_head(w.dq, Tp, a.out, b * T * orow + h * HD, orow, 0, T, d, a.angles, false, 1.0f, w.tmp);
  for (int64_t t = 0; t < T; ++t) {
    float sum = 0.0f;
    const float *g = w.dout + t * HDp, *o = w.dq + t * HDp;
#pragma omp simd reduction(+ : sum)
    for (int64_t c = 0; c < HDp; ++c) sum += g[c] * o[c];
    D[t] = sum;
  }
  std::fill(w.dq, w.dq + Tp * HDp, 0.0f);
  for (const RowTile& kt : a.key_tiles) {
    const int64_t k0 = kt.row0, kn = kt.n;
    for (const RowTile& qt : a.query_tiles) {
      if (kt.pos > qt.pos + qt.n - 1) continue;  // every key after every query
      const int64_t q0 = qt.row0, qn = qt.n;
      tile_product<false>(w.s, kTile, w.q + q0 * HDp, HDp, 1, w.kt + k0, Tp, qn, kTile, HD);
      tile_product<false>(w.dp, kTile, w.dout + q0 * HDp, HDp, 1, w.vt + k0, Tp, qn, kTile, HD);
      for (int64_t i = 0; i < qn; ++i) {
        const int64_t t = qt.pos + i, n = visible_keys(t, kt.pos, kn);
        float *s = w.s + i * kTile, *dp = w.dp + i * kTile;
        const float m = lse[q0 + i], Dt = D[q0 + i];
        if (drop && n > 0) dropout_factors(a.dropout, b, static_cast<uint64_t>((h * S + t) * S + kt.pos), n, w.f);
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
  add_rows(a.dqkv, b * T * row + d.q_col(h), row, a.block.queries, w.dq, d, a.angles, true, w.tmp);
}

void backward_group(const BackwardArgs& a, Tensor dkv, const Tensor& kv, float* scratch, int64_t b, int64_t g,
                    BackwardBuffers& w) {
  const FlashDims& d = a.d;
  const int64_t T = d.T, HDp = d.HDp, Tp = d.Tp(), row = d.qkv_row();
  load_rows(w.k, Tp, kv, b * T * row + d.k_col(g), row, a.block.keys, d, a.angles, true, 1.0f, w.tmp);
  load_rows(w.v, Tp, kv, b * T * row + d.v_col(g), row, a.block.keys, d, a.angles, false, 1.0f, w.tmp);
  transpose_tile(w.kt, Tp, w.k, Tp, HDp);
  transpose_tile(w.vt, Tp, w.v, Tp, HDp);
  std::fill(w.dk, w.dk + Tp * HDp, 0.0f);
  std::fill(w.dv, w.dv + Tp * HDp, 0.0f);
  for (int64_t h = g * d.R; h < (g + 1) * d.R; ++h) backward_head(a, scratch + (b * d.NH + h) * T, b, h, w);
  add_rows(dkv, b * T * row + d.k_col(g), row, a.block.keys, w.dk, d, a.angles, true, w.tmp);
  add_rows(dkv, b * T * row + d.v_col(g), row, a.block.keys, w.dv, d, a.angles, false, w.tmp);
}

float* thread_buffer(size_t floats) {
  return static_cast<float*>(workspace(Workspace::ExpandA, floats * sizeof(float)));
}

}  // namespace

void flash_attention_forward(Tensor out, Tensor lse, Tensor qkv, Tensor kv, int64_t num_groups, const Rope& rope,
                             const Dropout& dropout, const AttentionBlock& block_in) {
  const FlashDims d = flash_dims(qkv, out, lse, num_groups, rope, "flash_attention_forward");
  const AttentionBlock block = checked_block(block_in, qkv, kv, "flash_attention_forward");
  check_float(out, "flash_attention_forward", "out");
  check_float(qkv, "flash_attention_forward", "qkv");
  if (kv.empty()) kv = qkv;
  check_float(kv, "flash_attention_forward", "kv");
  float* lse_p = f32_arg(lse, "flash_attention_forward", "lse");
  if (dropout.p > 0.0f) dropout_scale(dropout);  // checks p
  const Angles angles{rope_table(block.seq_length, d.half, rope), block.seq_length, d.half};
  const std::vector<RowTile> query_tiles = row_tiles(block.queries, d.T), key_tiles = row_tiles(block.keys, d.T);
  const int64_t tiles = static_cast<int64_t>(query_tiles.size()), items = d.B * d.NH * tiles;
#pragma omp parallel
  {
    ForwardBuffers w(thread_buffer(ForwardBuffers::floats(d)), d);
    // Longest items (query tiles near the end see the most keys) first.
#pragma omp for schedule(dynamic, 1)
    for (int64_t item = 0; item < items; ++item) {
      const int64_t qi = tiles - 1 - item / (d.B * d.NH), bh = item % (d.B * d.NH);
      forward_tile(out, lse_p, qkv, kv, d, angles, dropout, block, key_tiles, bh / d.NH, bh % d.NH, query_tiles[qi],
                   w);
    }
  }
}

void flash_attention_backward(Tensor dqkv, Tensor dkv, Tensor scratch, Tensor dout, Tensor qkv, Tensor kv, Tensor out,
                              Tensor lse, int64_t num_groups, const Rope& rope, const Dropout& dropout,
                              const AttentionBlock& block_in) {
  if (dqkv.empty()) return;
  const FlashDims d = flash_dims(qkv, out, lse, num_groups, rope, "flash_attention_backward");
  const AttentionBlock block = checked_block(block_in, qkv, kv, "flash_attention_backward");
  TESSERA_CHECK(!block.merge, "flash_attention_backward: a block is never merged in the backward");
  check_flash_backward(dqkv, dkv, scratch, dout, qkv, kv, out, lse);
  if (kv.empty()) kv = qkv, dkv = dqkv;
  for (auto [t, name] : {std::pair{&dqkv, "dqkv"}, {&dkv, "dkv"}, {&dout, "dout"}, {&qkv, "qkv"}, {&kv, "kv"},
                         {&out, "out"}})
    check_float(*t, "flash_attention_backward", name);
  const float* lse_p = f32_arg(lse, "flash_attention_backward", "lse");
  float* scratch_p = f32_arg(scratch, "flash_attention_backward", "scratch");
  if (dropout.p > 0.0f) dropout_scale(dropout);
  const Angles angles{rope_table(block.seq_length, d.half, rope), block.seq_length, d.half};
  const std::vector<RowTile> query_tiles = row_tiles(block.queries, d.T), key_tiles = row_tiles(block.keys, d.T);
  const BackwardArgs args{dqkv, lse_p, dout, qkv, out, d, angles, dropout, block, query_tiles, key_tiles};
#pragma omp parallel
  {
    BackwardBuffers w(thread_buffer(BackwardBuffers::floats(d)), d);
#pragma omp for schedule(dynamic, 1)
    for (int64_t bg = 0; bg < d.B * d.NG; ++bg) backward_group(args, dkv, kv, scratch_p, bg / d.NG, bg % d.NG, w);
  }
}

// D = rowsum(dout * out) per row, f32.
Shape flash_attention_scratch(const Device&, int64_t B, int64_t NH, int64_t T) { return {B, NH, T}; }

}  // namespace tessera::ops::cpu
