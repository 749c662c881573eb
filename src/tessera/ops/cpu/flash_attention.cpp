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
// max grows); items run head by head, and a thread loads a group's whole K^T and V once for
// every query tile of the group's heads it runs. Backward: one work item per (b, group),
// owning every column of its group in dqkv: the group's K, V and their transposes are loaded
// once for its R heads, and for each head, key tile and
// query tile at or below the diagonal the probabilities are recomputed from lse, then dV, dS,
// dQ and dK follow. Dropout factors come from dropout_mask.h with attention_forward's element
// index, so both kernels drop the same probabilities.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "tessera/ops/cpu/amx.h"
#include "tessera/ops/cpu/cpu_ops.h"
#include "tessera/ops/cpu/dropout_mask.h"
#include "tessera/ops/cpu/fast_math.h"
#include "tessera/ops/cpu/flash_attention_tile.h"
#include "tessera/ops/cpu/rope_rotation.h"
#include "tessera/ops/cpu/shape_checks.h"
#include "tessera/ops/cpu/storage.h"

namespace tessera::ops::cpu {
namespace {

using flash::Bf16A;
using flash::F32A;
using flash::F32B;
using flash::kVec;
using flash::PairB;
using flash::tile_product;
using flash::tile_product_bf16;
using flash::Vec;

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

// Asks for the lines of n rows of `bytes` bytes, `stride` bytes apart, from p on.
void prefetch_rows(const char* p, int64_t n, int64_t stride, int64_t bytes) {
  for (int64_t r = 0; r < n; ++r)
    for (int64_t b = 0; b < bytes; b += 64) __builtin_prefetch(p + r * stride + b);
}

// widen() of `rows` rows of `cols` elements, ld apart, each run of kAhead rows prefetched
// while the run before it is read. A head's rows are a whole token's qkv (or out) apart, beyond
// the hardware prefetchers' reach (they follow a stream within a 4 KiB page): a row-by-row
// copy waits on every line in turn. These copies are ~12 % of the backward's time; the
// prefetch takes a few % off.
void widen_rows(float* dst, const Tensor& t, int64_t off, int64_t rows, int64_t cols, int64_t ld) {
  constexpr int64_t kAhead = 16;
  const int64_t es = static_cast<int64_t>(dtype_size(t.dtype)), stride = ld * es, bytes = cols * es;
  const char* base = cpu_memory(t) + off * es;
  prefetch_rows(base, std::min(rows, kAhead), stride, bytes);
  for (int64_t r0 = 0; r0 < rows; r0 += kAhead) {
    if (r0 + kAhead < rows) prefetch_rows(base + (r0 + kAhead) * stride, std::min(kAhead, rows - r0 - kAhead), stride, bytes);
    widen(dst + r0 * cols, t, off + r0 * ld, std::min(kAhead, rows - r0), cols, ld);
  }
}

// The head-wide column blocks (one to kMax, consecutive in each row) that one traversal of a
// tensor's rows moves, each to or from its own rows of stride HDp, rotated by RoPE or not. A
// head's rows lie a token's row apart, each on its own page, and a traversal waits on their
// misses (the prefetch in widen_rows does): a group's k and v, adjacent in qkv, travel
// together, one traversal instead of two.
struct HeadParts {
  static constexpr int kMax = 2;
  struct Part {
    float* rows;
    bool rotated;
  } part[kMax];
  int n;
  HeadParts from_row(int64_t r, int64_t HDp) const {
    HeadParts p = *this;
    for (int i = 0; i < n; ++i) p.part[i].rows += r * HDp;
    return p;
  }
};
HeadParts head(float* rows, bool rotated = false) { return {{{rows, rotated}}, 1}; }

// For each part: its rows r < rows (rows < pad_rows zero-padded, and columns HD..HDp) = its HD
// columns (part i at element off + i*HD) of rows t0 + r of `t` (row stride ld), rotated by the
// angles of position t0 + r when the part is and RoPE is on, times scale. tmp: rows * n * HD
// floats.
void load_head(const HeadParts& parts, int64_t pad_rows, const Tensor& t, int64_t off, int64_t ld, int64_t t0,
               int64_t rows, const FlashDims& d, const Angles& angles, float scale, float* tmp) {
  const int64_t HD = d.HD, HDp = d.HDp, width = parts.n * HD;
  widen_rows(tmp, t, off, rows, width, ld);
  for (int i = 0; i < parts.n; ++i) {
    float* dst = parts.part[i].rows;
    for (int64_t r = 0; r < rows; ++r) {
      float* y = dst + r * HDp;
      const float* x = tmp + r * width + i * HD;
      if (parts.part[i].rotated && angles.table)
        rotate<false>(y, x, angles.cos(t0 + r), angles.sin(t0 + r), 1.0f, d.half, HD);
      else
        std::memcpy(y, x, static_cast<size_t>(HD) * sizeof(float));
      if (scale != 1.0f) {
#pragma omp simd
        for (int64_t c = 0; c < HD; ++c) y[c] *= scale;
      }
      std::fill(y + HD, y + HDp, 0.0f);
    }
    std::fill(dst + rows * HDp, dst + pad_rows * HDp, 0.0f);
  }
}

// dstT[i*ldt + r] = src[r*lds + i] for r < rows, i < cols, in blocks of 16 x 16: a row at a
// time writes one element per destination row, ldt floats apart, and with ldt a multiple of
// 1024 every line of such a column falls into one L1 set and is evicted before its next
// element (15 % of the forward's time when it transposed key tiles that way).
void transpose_rows(float* dstT, int64_t ldt, const float* src, int64_t lds, int64_t rows, int64_t cols) {
  constexpr int64_t kBlock = kVec;
  for (int64_t r0 = 0; r0 < rows; r0 += kBlock) {
    const int64_t r1 = std::min(rows, r0 + kBlock);
    for (int64_t i0 = 0; i0 < cols; i0 += kBlock)
      for (int64_t i = i0; i < std::min(cols, i0 + kBlock); ++i)
        for (int64_t r = r0; r < r1; ++r) dstT[i * ldt + r] = src[r * lds + i];
  }
}

// Rows t0 + r (r < rows) of each part's HD columns (part i at element off + i*HD) of t (row
// stride ld) += the part's rows (stride HDp) rotated back (the transposed rotation) when the
// part is rotated; rounded once. tmp: rows * n * HD floats.
void add_head(const Tensor& t, int64_t off, int64_t ld, int64_t t0, int64_t rows, const HeadParts& parts,
              const FlashDims& d, const Angles& angles, float* tmp) {
  const int64_t HD = d.HD, width = parts.n * HD;
  widen_rows(tmp, t, off, rows, width, ld);
  for (int i = 0; i < parts.n; ++i) {
    const float* src = parts.part[i].rows;
    for (int64_t r = 0; r < rows; ++r) {
      float* y = tmp + r * width + i * HD;
      if (parts.part[i].rotated && angles.table)
        rotate<true>(y, src + r * d.HDp, angles.cos(t0 + r), angles.sin(t0 + r), -1.0f, d.half, HD);
      else
        rotate<true>(y, src + r * d.HDp, nullptr, nullptr, 1.0f, 0, HD);
    }
  }
  narrow(t, off, ld, tmp, width, rows, width);
}

// How many keys of a tile (kn keys from position k0) the query at position t sees: a prefix.
int64_t visible_keys(int64_t t, int64_t k0, int64_t kn) { return std::clamp<int64_t>(t - k0 + 1, 0, kn); }

// Rows [0, T) of each part's columns at element `off` of rows of sample b of t (row stride
// ld) into its rows (rows up to Tp zeroed), each run rotated at its positions where the part
// is, times scale: load_head over a whole sequence placed by `rows`.
void load_rows(const HeadParts& parts, int64_t Tp, const Tensor& t, int64_t off, int64_t ld, const SequenceRows& rows,
               const FlashDims& d, const Angles& angles, float scale, float* tmp) {
  for_each_run(rows, d.T, [&](int64_t row0, int64_t n, int64_t pos) {
    load_head(parts.from_row(row0, d.HDp), n, t, off + row0 * ld, ld, pos, n, d, angles, scale, tmp);
  });
  for (int i = 0; i < parts.n; ++i)
    std::fill(parts.part[i].rows + d.T * d.HDp, parts.part[i].rows + Tp * d.HDp, 0.0f);
}

// add_head over a whole sequence placed by `rows`.
void add_rows(const Tensor& t, int64_t off, int64_t ld, const SequenceRows& rows, const HeadParts& parts,
              const FlashDims& d, const Angles& angles, float* tmp) {
  for_each_run(rows, d.T, [&](int64_t row0, int64_t n, int64_t pos) {
    add_head(t, off + row0 * ld, ld, pos, n, parts.from_row(row0, d.HDp), d, angles, tmp);
  });
}

// Carves a thread's buffer into arrays, each 64-byte aligned; with no buffer it only counts
// the bytes (the buffers' sizes come from the same code that lays them out).
struct Carve {
  char* base;
  size_t used = 0;
  template <class E>
  E* take(int64_t n) {
    E* r = base ? reinterpret_cast<E*>(base + used) : nullptr;
    used += static_cast<size_t>(round_up(n * static_cast<int64_t>(sizeof(E)), 64));
    return r;
  }
};

// ---- bf16 operands (the Product16 path: flash_attention_tile.h's Bf16A and PairB) ----------
// A 16-bit run on a CPU with AMX rounds the operands of every tile product to bf16 (exact for
// the stored bf16 q, k, v and dout; one rounding for rotated or scaled ones, the
// probabilities and the score gradients) and accumulates in f32. The AMX products read K in
// steps of 32 values and A in blocks of 16 rows, so the operands are padded: head dims to
// HDb = a multiple of 32, every tile's K to kTile, with zeros.

// dst[r*ld + c] = bf16(src[r*src_ld + c]) for r < rows, c < cols; columns cols..ld of dst: 0.
void round_rows(uint16_t* dst, int64_t ld, const float* src, int64_t src_ld, int64_t rows, int64_t cols) {
  for (int64_t r = 0; r < rows; ++r) {
#pragma omp simd
    for (int64_t c = 0; c < cols; ++c) dst[r * ld + c] = f32_to_bf16(src[r * src_ld + c]);
    std::fill(dst + r * ld + cols, dst + (r + 1) * ld, uint16_t{0});
  }
}

// bf16 pair of rows r and r + 1 of src (stride ld) at column c; rows at or past `rows` are 0.
inline uint32_t row_pair(const float* src, int64_t ld, int64_t r, int64_t c, int64_t rows) {
  const uint32_t lo = r < rows ? f32_to_bf16(src[r * ld + c]) : 0u;
  const uint32_t hi = r + 1 < rows ? f32_to_bf16(src[(r + 1) * ld + c]) : 0u;
  return lo | hi << 16;
}

// The row tiles of src [rows of a sequence, HDp] as PairB operands over their rows, tile i at
// dst + i * kTile/2 * HDp: dst[(i*kTile/2 + q)*HDp + c] pairs rows row0 + 2q, row0 + 2q + 1 of
// tile i (past its n rows: 0). Pairs follow each tile's first row, which may be odd.
void pair_tiles(uint32_t* dst, const float* src, const std::vector<RowTile>& tiles, int64_t HDp) {
  for (size_t i = 0; i < tiles.size(); ++i) {
    const RowTile& t = tiles[i];
    uint32_t* out = dst + static_cast<int64_t>(i) * (kTile / 2) * HDp;
    for (int64_t q = 0; q < kTile / 2; ++q)
      for (int64_t c = 0; c < HDp; ++c) out[q * HDp + c] = row_pair(src + t.row0 * HDp, HDp, 2 * q, c, t.n);
  }
}

// src [rows, HDp] transposed as a PairB operand over its columns: dst[q*ldt + r] pairs columns
// 2q, 2q + 1 of row r, for r < rows and q < pairs (columns past HDp: 0); columns rows..ldt of
// dst are 0. In blocks of 16 rows (as transpose_rows).
void pair_transpose(uint32_t* dst, int64_t ldt, int64_t pairs, const float* src, int64_t rows, int64_t HDp) {
  constexpr int64_t kBlock = kVec;
  for (int64_t r0 = 0; r0 < rows; r0 += kBlock) {
    const int64_t r1 = std::min(rows, r0 + kBlock);
    for (int64_t q = 0; q < HDp / 2; ++q)
      for (int64_t r = r0; r < r1; ++r)
        dst[q * ldt + r] = f32_to_bf16(src[r * HDp + 2 * q]) | uint32_t{f32_to_bf16(src[r * HDp + 2 * q + 1])} << 16;
  }
  for (int64_t q = 0; q < pairs; ++q) std::fill(dst + q * ldt + (q < HDp / 2 ? rows : 0), dst + (q + 1) * ldt, 0u);
}

// A tile [rows, kTile] (probabilities or score gradients) as a PairB operand over its rows:
// dst[q*kTile + j] pairs rows 2q, 2q + 1 for q < kTile/2 (rows at or past `rows`: 0). Row by
// row, so it vectorises (a transposed bf16 copy, scalar, took a fifth of the backward).
void pair_rows(uint32_t* dst, const float* src, int64_t rows) {
  for (int64_t q = 0; q < kTile / 2; ++q) {
    const int64_t r = 2 * q;
    const float* lo = src + r * kTile;
    const float* hi = lo + kTile;
    uint32_t* out = dst + q * kTile;
    if (r + 1 < rows) {
#pragma omp simd
      for (int64_t j = 0; j < kTile; ++j) out[j] = f32_to_bf16(lo[j]) | uint32_t{f32_to_bf16(hi[j])} << 16;
    } else if (r < rows) {
#pragma omp simd
      for (int64_t j = 0; j < kTile; ++j) out[j] = f32_to_bf16(lo[j]);
    } else {
      std::fill(out, out + kTile, 0u);
    }
  }
}

// dst[c*ld + r] = bf16(src[r*HDp + c]) for r < rows, c < HDp; rows HDp..HDb of dst and its
// columns rows..ld: 0. A head's q or dout transposed as a Bf16A operand (dK^T += Q^T dS).
void transpose_round(uint16_t* dst, int64_t ld, int64_t HDb, const float* src, int64_t rows, int64_t HDp) {
  constexpr int64_t kBlock = kVec;
  for (int64_t r0 = 0; r0 < rows; r0 += kBlock) {
    const int64_t r1 = std::min(rows, r0 + kBlock);
    for (int64_t c = 0; c < HDp; ++c)
      for (int64_t r = r0; r < r1; ++r) dst[c * ld + r] = f32_to_bf16(src[r * HDp + c]);
  }
  for (int64_t c = 0; c < HDb; ++c) std::fill(dst + c * ld + (c < HDp ? rows : 0), dst + (c + 1) * ld, uint16_t{0});
}

// The bf16 operands' head dim: HD padded to whole steps of the AMX products' K.
int64_t bf16_head_dim(const FlashDims& d) { return round_up(d.HD, 2 * flash::kPairStep); }

// One (b, group)'s keys and values over the whole block, as the tile products read them.
// f32: k and v [Tp, HDp] row-major (RoPE applied to k), kt = K^T [HDp, ldt] and, for the
// backward, vt = V^T. ldt leaves a whole tile of zeros past the last key, so the kTile columns
// a key tile's product reads from its first row stay in the row wherever the tile starts
// (tiles follow the runs of a block's positions, not multiples of kTile).
// bf16 (the same, as PairB operands): kt2 = K^T and vt2 = V^T in column pairs [HDb/2, ldt],
// v2 (forward) and k2 (backward) each key tile's rows in pairs (pair_tiles).
struct GroupKeys {
  float *k, *v, *kt = nullptr, *vt = nullptr;
  uint32_t *kt2 = nullptr, *vt2 = nullptr, *v2 = nullptr, *k2 = nullptr;
  int64_t ldt;
  bool backward, bf16;
  GroupKeys(Carve& c, const FlashDims& d, bool backward_, bool bf16_)
      : ldt(round_up(d.T, kVec) + kTile), backward(backward_), bf16(bf16_) {
    const int64_t n = d.Tp() * d.HDp, t = d.HDp * ldt, pairs = (d.tiles() + 1) * (kTile / 2) * d.HDp;
    k = c.take<float>(n), v = c.take<float>(n);
    if (!bf16) {
      kt = c.take<float>(t);
      if (backward) vt = c.take<float>(t);
      return;
    }
    const int64_t t2 = bf16_head_dim(d) / 2 * ldt;
    kt2 = c.take<uint32_t>(t2);
    if (backward) {
      vt2 = c.take<uint32_t>(t2);
      k2 = c.take<uint32_t>(pairs);
    } else {
      v2 = c.take<uint32_t>(pairs);
    }
  }
  // Group g of sample b of kv, its rows placed by `keys` (tiled as `tiles`). tmp: 2 * T * HD floats.
  void load(const Tensor& kv, const FlashDims& d, const Angles& angles, const SequenceRows& keys,
            const std::vector<RowTile>& tiles, int64_t b, int64_t g, float* tmp) {
    const int64_t T = d.T, row = d.qkv_row(), Tp = d.Tp();
    // k and v are adjacent in each row (v_col = k_col + HD): one traversal
    load_rows({{{k, true}, {v, false}}, 2}, Tp, kv, b * T * row + d.k_col(g), row, keys, d, angles, 1.0f, tmp);
    if (!bf16) {
      transpose(kt, k, d);
      if (vt) transpose(vt, v, d);
      return;
    }
    pair_transpose(kt2, ldt, bf16_head_dim(d) / 2, k, T, d.HDp);
    if (backward) {
      pair_transpose(vt2, ldt, bf16_head_dim(d) / 2, v, T, d.HDp);
      pair_tiles(k2, k, tiles, d.HDp);
    } else {
      pair_tiles(v2, v, tiles, d.HDp);
    }
  }
  // Key tile i's pairs in v2 or k2.
  static int64_t tile_pairs(int64_t i, const FlashDims& d) { return i * (kTile / 2) * d.HDp; }

 private:
  void transpose(float* dstT, const float* src, const FlashDims& d) const {
    transpose_rows(dstT, ldt, src, d.HDp, d.T, d.HDp);
    for (int64_t i = 0; i < d.HDp; ++i) std::fill(dstT + i * ldt + d.T, dstT + (i + 1) * ldt, 0.0f);
  }
};

// Per-thread buffers of the forward: one query tile's state (and its bf16 operands), and the
// keys and values of the (b, group) the thread ran last, which its next items (items run head
// by head, a group's heads one after another) reuse instead of loading and transposing each
// key tile per tile pair.
struct ForwardBuffers {
  float *q, *s, *o, *m, *l, *f, *tmp;
  uint16_t *qb = nullptr, *pb = nullptr;  // bf16: the query tile, the probabilities
  GroupKeys keys;
  int64_t b = -1, g = -1;  // whose keys `keys` holds
  ForwardBuffers(Carve& c, const FlashDims& d, bool bf16)
      : q(c.take<float>(kTile * d.HDp)), s(c.take<float>(kTile * kTile)), o(c.take<float>(kTile * d.HDp)),
        m(c.take<float>(kTile)), l(c.take<float>(kTile)), f(c.take<float>(kTile)),
        tmp(c.take<float>(HeadParts::kMax * d.Tp() * d.HD)), keys(c, d, false, bf16) {
    if (bf16) qb = c.take<uint16_t>(kTile * bf16_head_dim(d)), pb = c.take<uint16_t>(kTile * kTile);
  }
  static size_t bytes(const FlashDims& d, bool bf16) {
    Carve c{nullptr};
    ForwardBuffers(c, d, bf16);
    return c.used;
  }
  const GroupKeys& keys_of(const Tensor& kv, const FlashDims& d, const Angles& angles, const SequenceRows& rows,
                           const std::vector<RowTile>& tiles, int64_t b_, int64_t g_) {
    if (b_ != b || g_ != g) keys.load(kv, d, angles, rows, tiles, b_, g_, tmp);
    b = b_, g = g_;
    return keys;
  }
};

// The forward's rows go kRows at a time through a key tile: their scores sit in vector
// registers (kTile keys = kTile / kVec vectors a row) from the product Q K^T through the online
// softmax to the probabilities; the tile's P V product follows.
constexpr int kRows = 4;
constexpr int kTileVecs = static_cast<int>(kTile / kVec);
static_assert(kTile % kVec == 0 && kTile % kRows == 0);

// What a group of rows of a query tile needs against one key tile.
struct RowGroup {
  float* p;            // kRows rows of kTile: the probabilities (stride kTile)
  float* o;            // kRows rows of HDp: the partial outputs
  float *m, *l;        // the rows' running max and denominator
  int64_t vis[kRows];  // how many keys (a prefix) each row sees; 0: none
};

// The online softmax step (FlashAttention-2's inner loop) of a group's rows, their scores in s
// (NV vectors of keys; keys past vis masked here): p = exp(score - the row's new max), 0 past
// vis and up to kTile; m and l updated; o rescaled to the new max. A row that sees no key
// keeps its state (a merged block's out and lse stay bit for bit).
template <int NV>
inline void online_softmax(Vec (&s)[kRows][NV], const RowGroup& g, int64_t HDp) {
  const Vec lane = [] {
    Vec v;
    for (int j = 0; j < kVec; ++j) v[j] = static_cast<float>(j);
    return v;
  }();
  const Vec minus_inf = Vec{} - std::numeric_limits<float>::infinity();
  for (int r = 0; r < kRows; ++r) {
    float* p = g.p + r * kTile;
    if (g.vis[r] == 0) {
      std::fill(p, p + kTile, 0.0f);
      continue;
    }
    if (g.vis[r] < NV * kVec) {
      const float vis = static_cast<float>(g.vis[r]);
      for (int n = 0; n < NV; ++n) s[r][n] = lane + static_cast<float>(n * kVec) < vis ? s[r][n] : minus_inf;
    }
    Vec most = s[r][0];
    for (int n = 1; n < NV; ++n) most = flash::max(most, s[r][n]);
    const float mx = std::max(g.m[r], flash::reduce_max(most));
    const float correction = mx == g.m[r] ? 1.0f : exp_fast(g.m[r] - mx);  // skips a scalar exp on most tiles
    Vec sum = Vec{};
    for (int n = 0; n < NV; ++n) {
      const Vec e = exp_fast_of<Vec, flash::IVec>(s[r][n] - mx);
      flash::store(p + n * kVec, e);
      sum += e;
    }
    std::fill(p + NV * kVec, p + kTile, 0.0f);
    g.m[r] = mx;
    g.l[r] = g.l[r] * correction + flash::reduce_add(sum);
    if (correction == 1.0f) continue;  // the max stayed (most tiles past the first few)
    float* o = g.o + r * HDp;
#pragma omp simd
    for (int64_t c = 0; c < HDp; ++c) o[c] *= correction;
  }
}

// The group's scores against NV vectors of keys: f32 from q (kRows rows, stride HDp) and the
// key tile's K^T (kt), or read back from p where the bf16 products left them; then the online
// softmax step.
template <int NV>
void softmax_rows(const RowGroup& g, const float* q, F32B kt, int64_t HD, int64_t HDp, bool bf16) {
  Vec s[kRows][NV];
  if (bf16) {
    for (int r = 0; r < kRows; ++r)
      for (int n = 0; n < NV; ++n) s[r][n] = flash::load(g.p + r * kTile + n * kVec);
  } else {
    flash::product_block(s, F32A{q, HDp, 1}, kt, HD);
  }
  online_softmax(s, g, HDp);
}

// Query tile qt of head h of sample b against every visible key tile of kv.
void forward_tile(Tensor out, float* lse, const Tensor& qkv, const Tensor& kv, const FlashDims& d,
                  const Angles& angles, const Dropout& dropout, const AttentionBlock& block,
                  const std::vector<RowTile>& key_tiles, int64_t b, int64_t h, const RowTile& qt, ForwardBuffers& w) {
  const int64_t T = d.T, S = block.seq_length, HD = d.HD, HDp = d.HDp, row = d.qkv_row();
  const int64_t q0 = qt.row0, qn = qt.n;
  const float scale = 1.0f / std::sqrt(static_cast<float>(HD));
  const bool drop = dropout.p > 0.0f, bf16 = w.qb != nullptr;
  float* lse_row = lse + (b * d.NH + h) * T + q0;
  load_head(head(w.q, true), kTile, qkv, (b * T + q0) * row + d.q_col(h), row, qt.pos, qn, d, angles, scale, w.tmp);
  const int64_t HDb = bf16_head_dim(d);
  if (bf16) round_rows(w.qb, HDb, w.q, HDp, qn, HDp);
  if (block.merge) {  // the online softmax's state of the keys seen before: max lse, sum 1, output out
    load_head(head(w.o), kTile, out, (b * T + q0) * d.out_row() + h * HD, d.out_row(), 0, qn, d, angles, 1.0f, w.tmp);
    for (int64_t i = 0; i < qn; ++i) {
      w.m[i] = lse_row[i];
      w.l[i] = std::isinf(lse_row[i]) ? 0.0f : 1.0f;
    }
  } else {
    std::fill(w.o, w.o + kTile * HDp, 0.0f);
    std::fill(w.m, w.m + kTile, -std::numeric_limits<float>::infinity());
    std::fill(w.l, w.l + kTile, 0.0f);
  }
  const GroupKeys& keys = w.keys_of(kv, d, angles, block.keys, key_tiles, b, h / d.R);
  for (size_t ki = 0; ki < key_tiles.size(); ++ki) {
    const RowTile& kt = key_tiles[ki];
    if (kt.pos > qt.pos + qn - 1) continue;  // every key after every query
    if (bf16)
      tile_product_bf16<false>(w.s, kTile, Bf16A{w.qb, HDb}, PairB{keys.kt2 + kt.row0, keys.ldt}, qn, kTile, HDb / 2);
    for (int64_t i0 = 0; i0 < qn; i0 += kRows) {
      RowGroup g{w.s + i0 * kTile, w.o + i0 * HDp, w.m + i0, w.l + i0, {}};
      int64_t most = 0;  // the group's rows see prefixes of the tile; the longest
      for (int r = 0; r < kRows; ++r) {
        g.vis[r] = i0 + r < qn ? visible_keys(qt.pos + i0 + r, kt.pos, kt.n) : 0;
        most = std::max(most, g.vis[r]);
      }
      if (most == 0) {  // nothing visible: the rows' state stays
        std::fill(g.p, g.p + kRows * kTile, 0.0f);
        continue;
      }
      const float* q = w.q + i0 * HDp;
      const F32B kt_cols = bf16 ? F32B{} : F32B{keys.kt + kt.row0, keys.ldt};
      switch ((most + kVec - 1) / kVec) {  // only the vectors of keys some row sees
        case 1: softmax_rows<1>(g, q, kt_cols, HD, HDp, bf16); break;
        case 2: softmax_rows<2>(g, q, kt_cols, HD, HDp, bf16); break;
        case 3: softmax_rows<3>(g, q, kt_cols, HD, HDp, bf16); break;
        default: softmax_rows<kTileVecs>(g, q, kt_cols, HD, HDp, bf16); break;
      }
      if (drop) {  // element (h*S + t)*S + key of the sample, as attention_forward's
        for (int r = 0; r < kRows; ++r) {
          if (g.vis[r] == 0) continue;
          const int64_t t = qt.pos + i0 + r;
          float* pr = g.p + r * kTile;
          dropout_factors(dropout, b, static_cast<uint64_t>((h * S + t) * S + kt.pos), g.vis[r], w.f);
#pragma omp simd
          for (int64_t j = 0; j < g.vis[r]; ++j) pr[j] *= w.f[j];
        }
      }
    }
    if (!bf16) {  // o += p v, query i over the keys j <= i + off it sees
      const flash::Band keys_seen{.k_hi = qt.pos - kt.pos};
      tile_product<true>(w.o, HDp, F32A{w.s, kTile, 1}, F32B{keys.v + kt.row0 * HDp, HDp}, qn, HDp, kt.n, 1.0f,
                         keys_seen);
    } else {
      round_rows(w.pb, kTile, w.s, kTile, qn, kTile);
      tile_product_bf16<true>(w.o, HDp, Bf16A{w.pb, kTile}, PairB{keys.v2 + GroupKeys::tile_pairs(ki, d), HDp}, qn, HDp,
                              kTile / 2);
    }
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

// Per-thread buffers of the backward of one (b, group): whole-sequence f32 copies, one tile
// pair's probabilities and score gradients, and with bf16 products their bf16 operands: the
// head's q and dout rows (qb, dob) and transposed (qT, doT: [HDb, Tp + kTile]), the tile pair's
// score gradients (dsb) and the probabilities and score gradients in row pairs (ppair, dspair);
// dV and dK accumulate transposed (dvT, dkT: [HDp, ldt]; dV^T += dO^T P needs no transposed
// tile), turned into dv and dk once per group.
struct BackwardBuffers {
  float *dk, *dv, *q, *dout, *dq, *tmp, *s, *dp, *f, *dkT = nullptr, *dvT = nullptr;
  uint16_t *qb = nullptr, *dob = nullptr, *qT = nullptr, *doT = nullptr, *dsb = nullptr;
  uint32_t *ppair = nullptr, *dspair = nullptr;
  int64_t ldq = 0;  // qT's and doT's row stride
  GroupKeys keys;
  BackwardBuffers(Carve& c, const FlashDims& d, bool bf16)
      : dk(c.take<float>(d.Tp() * d.HDp)), dv(c.take<float>(d.Tp() * d.HDp)), q(c.take<float>(d.Tp() * d.HDp)),
        dout(c.take<float>(d.Tp() * d.HDp)), dq(c.take<float>(d.Tp() * d.HDp)),
        tmp(c.take<float>(HeadParts::kMax * d.Tp() * d.HD)),
        s(c.take<float>(kTile * kTile)), dp(c.take<float>(kTile * kTile)), f(c.take<float>(kTile)),
        keys(c, d, true, bf16) {
    if (!bf16) return;
    // qb and dob: a tile of rows past the last, read by a query tile that starts late (runs);
    // qT and doT likewise in columns
    const int64_t HDb = bf16_head_dim(d), rows = (d.Tp() + kTile) * HDb;
    ldq = d.Tp() + kTile;
    qb = c.take<uint16_t>(rows), dob = c.take<uint16_t>(rows), qT = c.take<uint16_t>(rows), doT = c.take<uint16_t>(rows);
    dsb = c.take<uint16_t>(kTile * kTile);
    ppair = c.take<uint32_t>(kTile * kTile / 2), dspair = c.take<uint32_t>(kTile * kTile / 2);
    dkT = c.take<float>(d.HDp * keys.ldt), dvT = c.take<float>(d.HDp * keys.ldt);
  }
  static size_t bytes(const FlashDims& d, bool bf16) {
    Carve c{nullptr};
    BackwardBuffers(c, d, bf16);
    return c.used;
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

// The probabilities (s) and score gradients (dp) of one tile pair from its scores (s) and
// dout . v (dp): s becomes the (dropped-out) probabilities a' for dV, dp the score gradients
// dS; rows past qn untouched. Scores of keys a row does not see may be stale (the products'
// band skips them): they are never used.
void probabilities_and_score_gradients(const BackwardArgs& a, const float* lse, const float* D, int64_t b,
                                       int64_t h, const RowTile& qt, const RowTile& kt, BackwardBuffers& w) {
  const int64_t S = a.block.seq_length;
  const bool drop = a.dropout.p > 0.0f;
  for (int64_t i = 0; i < qt.n; ++i) {
    const int64_t t = qt.pos + i, n = visible_keys(t, kt.pos, kt.n);
    float *s = w.s + i * kTile, *dp = w.dp + i * kTile;
    const float m = lse[qt.row0 + i], Dt = D[qt.row0 + i];
    // The loops read every factor unconditionally (p is 0 past the visible keys), so they
    // vectorise; a conditional read of w.f kept them scalar.
    if (drop) {
      if (n > 0) dropout_factors(a.dropout, b, static_cast<uint64_t>((h * S + t) * S + kt.pos), n, w.f);
      std::fill(w.f + std::max<int64_t>(n, 0), w.f + kTile, 0.0f);
#pragma omp simd
      for (int64_t j = 0; j < kTile; ++j) {
        const float p = j < n ? exp_fast(s[j] - m) : 0.0f;
        s[j] = p * w.f[j];
        dp[j] = j < n ? p * (dp[j] * w.f[j] - Dt) : 0.0f;
      }
    } else {
#pragma omp simd
      for (int64_t j = 0; j < kTile; ++j) {
        const float p = j < n ? exp_fast(s[j] - m) : 0.0f;
        s[j] = p;
        dp[j] = j < n ? p * (dp[j] - Dt) : 0.0f;
      }
    }
  }
}

// One tile pair's five products in f32: scores and dout . v, then dV, dQ, dK.
void tile_pair_f32(const BackwardArgs& a, const float* lse, const float* D, int64_t b, int64_t h,
                   const RowTile& qt, const RowTile& kt, BackwardBuffers& w) {
  const int64_t HD = a.d.HD, HDp = a.d.HDp, q0 = qt.row0, qn = qt.n, k0 = kt.row0, kn = kt.n;
  const GroupKeys& keys = w.keys;
  // Query i sees key j <= i + off: the band of each product on a diagonal tile.
  const int64_t off = qt.pos - kt.pos;
  const flash::Band seen_keys{.n_hi = off}, keys_seen{.k_hi = off}, queries_seeing{.k_lo = -off};
  tile_product<false>(w.s, kTile, F32A{w.q + q0 * HDp, HDp, 1}, F32B{keys.kt + k0, keys.ldt}, qn, kTile, HD, 1.0f,
                      seen_keys);
  tile_product<false>(w.dp, kTile, F32A{w.dout + q0 * HDp, HDp, 1}, F32B{keys.vt + k0, keys.ldt}, qn, kTile, HD, 1.0f,
                      seen_keys);
  probabilities_and_score_gradients(a, lse, D, b, h, qt, kt, w);
  tile_product<true>(w.dv + k0 * HDp, HDp, F32A{w.s, 1, kTile}, F32B{w.dout + q0 * HDp, HDp}, kn, HDp, qn, 1.0f,
                     queries_seeing);
  tile_product<true>(w.dq + q0 * HDp, HDp, F32A{w.dp, kTile, 1}, F32B{keys.k + k0 * HDp, HDp}, qn, HDp, kn, 1.0f,
                     keys_seen);
  tile_product<true>(w.dk + k0 * HDp, HDp, F32A{w.dp, 1, kTile}, F32B{w.q + q0 * HDp, HDp}, kn, HDp, qn, 1.0f,
                     queries_seeing);
}

// The same with bf16 operands (ki: the key tile's index, for its row pairs), dV and dK
// transposed.
void tile_pair_bf16(const BackwardArgs& a, const float* lse, const float* D, int64_t b, int64_t h,
                    const RowTile& qt, const RowTile& kt, int64_t ki, BackwardBuffers& w) {
  const FlashDims& d = a.d;
  const int64_t HDp = d.HDp, HDb = bf16_head_dim(d), q0 = qt.row0, qn = qt.n, k0 = kt.row0;
  const GroupKeys& keys = w.keys;
  tile_product_bf16<false>(w.s, kTile, Bf16A{w.qb + q0 * HDb, HDb}, PairB{keys.kt2 + k0, keys.ldt}, qn, kTile, HDb / 2);
  tile_product_bf16<false>(w.dp, kTile, Bf16A{w.dob + q0 * HDb, HDb}, PairB{keys.vt2 + k0, keys.ldt}, qn, kTile,
                      HDb / 2);
  probabilities_and_score_gradients(a, lse, D, b, h, qt, kt, w);
  pair_rows(w.ppair, w.s, qn);
  pair_rows(w.dspair, w.dp, qn);
  round_rows(w.dsb, kTile, w.dp, kTile, qn, kTile);
  tile_product_bf16<true>(w.dvT + k0, keys.ldt, Bf16A{w.doT + q0, w.ldq}, PairB{w.ppair, kTile}, HDp, kTile,
                          kTile / 2);
  tile_product_bf16<true>(w.dq + q0 * HDp, HDp, Bf16A{w.dsb, kTile},
                          PairB{keys.k2 + GroupKeys::tile_pairs(ki, d), HDp}, qn, HDp, kTile / 2);
  tile_product_bf16<true>(w.dkT + k0, keys.ldt, Bf16A{w.qT + q0, w.ldq}, PairB{w.dspair, kTile}, HDp, kTile,
                          kTile / 2);
}

// One head h's contributions: dq into dqkv, dk and dv into the group's accumulators.
void backward_head(const BackwardArgs& a, float* D, int64_t b, int64_t h, BackwardBuffers& w) {
  const FlashDims& d = a.d;
  const int64_t T = d.T, HD = d.HD, HDp = d.HDp, Tp = d.Tp(), row = d.qkv_row();
  const int64_t orow = d.out_row();
  const float scale = 1.0f / std::sqrt(static_cast<float>(HD));
  const float* lse = a.lse + (b * d.NH + h) * T;
  load_rows(head(w.q, true), Tp, a.qkv, b * T * row + d.q_col(h), row, a.block.queries, d, a.angles, scale, w.tmp);
  load_head(head(w.dout), Tp, a.dout, b * T * orow + h * HD, orow, 0, T, d, a.angles, 1.0f, w.tmp);
  load_head(head(w.dq), Tp, a.out, b * T * orow + h * HD, orow, 0, T, d, a.angles, 1.0f, w.tmp);
  for (int64_t t = 0; t < T; ++t) {
    float sum = 0.0f;
    const float *g = w.dout + t * HDp, *o = w.dq + t * HDp;
#pragma omp simd reduction(+ : sum)
    for (int64_t c = 0; c < HDp; ++c) sum += g[c] * o[c];
    D[t] = sum;
  }
  std::fill(w.dq, w.dq + Tp * HDp, 0.0f);
  const bool bf16 = w.qb != nullptr;
  if (bf16) {
    round_rows(w.qb, bf16_head_dim(d), w.q, HDp, T, HDp);
    round_rows(w.dob, bf16_head_dim(d), w.dout, HDp, T, HDp);
    transpose_round(w.qT, w.ldq, bf16_head_dim(d), w.q, T, HDp);
    transpose_round(w.doT, w.ldq, bf16_head_dim(d), w.dout, T, HDp);
  }
  for (size_t ki = 0; ki < a.key_tiles.size(); ++ki) {
    const RowTile& kt = a.key_tiles[ki];
    for (const RowTile& qt : a.query_tiles) {
      if (kt.pos > qt.pos + qt.n - 1) continue;  // every key after every query
      if (bf16)
        tile_pair_bf16(a, lse, D, b, h, qt, kt, static_cast<int64_t>(ki), w);
      else
        tile_pair_f32(a, lse, D, b, h, qt, kt, w);
    }
  }
#pragma omp simd
  for (int64_t e = 0; e < T * HDp; ++e) w.dq[e] *= scale;  // scores are scale * q.k
  add_rows(a.dqkv, b * T * row + d.q_col(h), row, a.block.queries, head(w.dq, true), d, a.angles, w.tmp);
}

void backward_group(const BackwardArgs& a, Tensor dkv, const Tensor& kv, float* scratch, int64_t b, int64_t g,
                    BackwardBuffers& w) {
  const FlashDims& d = a.d;
  const int64_t T = d.T, HDp = d.HDp, Tp = d.Tp(), row = d.qkv_row();
  w.keys.load(kv, d, a.angles, a.block.keys, a.key_tiles, b, g, w.tmp);
  std::fill(w.dk, w.dk + Tp * HDp, 0.0f);
  std::fill(w.dv, w.dv + Tp * HDp, 0.0f);
  if (w.dkT) {
    std::fill(w.dkT, w.dkT + HDp * w.keys.ldt, 0.0f);
    std::fill(w.dvT, w.dvT + HDp * w.keys.ldt, 0.0f);
  }
  for (int64_t h = g * d.R; h < (g + 1) * d.R; ++h) backward_head(a, scratch + (b * d.NH + h) * T, b, h, w);
  if (w.dkT) {  // dk[r, c] = dkT[c, r]
    transpose_rows(w.dk, HDp, w.dkT, w.keys.ldt, HDp, T);
    transpose_rows(w.dv, HDp, w.dvT, w.keys.ldt, HDp, T);
  }
  add_rows(dkv, b * T * row + d.k_col(g), row, a.block.keys, {{{w.dk, true}, {w.dv, false}}, 2}, d, a.angles, w.tmp);
}

Carve thread_buffer(size_t bytes) { return Carve{static_cast<char*>(workspace(Workspace::ExpandA, bytes))}; }

// Whether the products take bf16 operands: a 16-bit run (bf16 qkv and kv) on a CPU with AMX
// (amx.h).
bool bf16_products(const Tensor& qkv, const Tensor& kv) {
  return qkv.dtype == DType::BF16 && kv.dtype == DType::BF16 && amx_available();
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
  const bool bf16 = bf16_products(qkv, kv);
#pragma omp parallel
  {
    Carve c = thread_buffer(ForwardBuffers::bytes(d, bf16));
    ForwardBuffers w(c, d, bf16);
    std::optional<AmxScope> amx;
    if (bf16) amx.emplace();
    // Head by head (a group's heads one after another share the thread's keys and values),
    // within a head the longest items (query tiles near the end see the most keys) first.
    // With at least 4 heads a thread, whole heads go to each thread, so no two threads load
    // the same keys and values (a tenth of the forward at 2 threads on GPT-2's 12 heads); with
    // fewer, single tiles balance the threads.
    const int64_t chunk = d.B * d.NH >= 4 * omp_get_num_threads() ? tiles : 1;
#pragma omp for schedule(dynamic, chunk)
    for (int64_t item = 0; item < items; ++item) {
      const int64_t bh = item / tiles, qi = tiles - 1 - item % tiles;
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
  const bool bf16 = bf16_products(qkv, kv);
#pragma omp parallel
  {
    Carve c = thread_buffer(BackwardBuffers::bytes(d, bf16));
    BackwardBuffers w(c, d, bf16);
    std::optional<AmxScope> amx;
    if (bf16) amx.emplace();
#pragma omp for schedule(dynamic, 1)
    for (int64_t bg = 0; bg < d.B * d.NG; ++bg) backward_group(args, dkv, kv, scratch_p, bg / d.NG, bg % d.NG, w);
  }
}

// D = rowsum(dout * out) per row, f32.
Shape flash_attention_scratch(const Device&, int64_t B, int64_t NH, int64_t T) { return {B, NH, T}; }

}  // namespace tessera::ops::cpu
