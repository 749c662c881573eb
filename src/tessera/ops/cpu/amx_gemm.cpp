// The linear layer's bf16 GEMMs on AMX (amx_gemm.h). One tile loop serves both:
//   C[M, N] (+)= A[M, K] @ B[K, N],
// A bf16, B in pairs of rows (VNNI: one uint32 holds B[2q, n] low and B[2q+1, n] high,
// TDPBF16PS's layout), C in blocks of 2 x 2 tiles of 16 x 16 f32 (tiles 0-3), A's two 16-row
// tiles in 4-5, B's two 16-column tiles in 6-7: per 32 values of K, four tile loads feed four
// TDPBF16PS. Both operands are packed so that every tile is 1 KB contiguous (TiledA, TiledB
// below): a block walks four sequential streams, and no tile's 16 rows fall into one of L1's
// sets, as rows 6-12 KB apart (W at C = 3072, y at OC = 3072) do.
// Each GEMM packs only what is small or used while hot:
// - forward  y[N,OC] = x W^T, as y^T = W x^T: A = W, 32 rows at a time packed by the thread that
//   owns them (W is read once), B = x^T in pairs (a 32-bit transpose of x, N x C), each 16 x 16
//   result tile transposed in registers as it is stored into y. Threads split OC.
// - weight gradient dW[OC,C] += dy^T x: A = dy^T, 32 rows at a time transposed by the thread
//   that owns those rows of dW; B = x in pairs of rows (tokens). dW's f32 tiles are loaded,
//   accumulated and stored back (the accumulation costs no extra pass), or start from zero
//   tiles when the gradient is assigned. Where the caller asks for dW's sum of squares (the
//   gradient norm's share of a step's last micro-batch), each block is squared as soon as it
//   is stored, from L1: the norm then never reads dW from memory again.
// Measured (bench/bf16_gemm_bench ... amx, 2-core Sapphire Rapids VM, cold): the weight
// gradient 1.0-1.3x oneDNN 2.6's brgemm, the forward 0.7-1.1x with K = 768 and 1.5x with
// K = 3072; a data gradient (dx = dy W, W packed in L1-sized panels) ran 0.7-1.0x and was
// dropped, linear.cpp's K tiles of oneDNN being faster: the tile loads, not TDPBF16PS, set the
// pace. With realistic data one core ran TDPBF16PS at ~1.7 TFLOP/s with both operands' tiles
// in L1, ~1.2 with one from L2, ~0.7 with both (~3.7 on all-zero tiles); 2 x 2 blocks need 16
// FLOP per byte loaded whatever the loop order.
// In a build without AMX-BF16, amx_linear_fits is false and the kernels throw.
#include "tessera/ops/cpu/amx_gemm.h"

#include <omp.h>

#include <cstring>

#include "tessera/core/error.h"
#include "tessera/ops/cpu/amx.h"
#include "tessera/ops/cpu/low_precision.h"

#if defined(__AMX_TILE__) && defined(__AMX_BF16__) && defined(__AVX512BW__) && defined(__linux__)
#include <immintrin.h>
#define TESSERA_AMX_GEMM 1
// GCC 12's AVX-512 intrinsics pass _mm512_undefined_epi32() as the unused source of their
// unmasked forms, which -Wmaybe-uninitialized reports at every inlined call.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

namespace tessera::ops::cpu {

#if defined(TESSERA_AMX_GEMM)
namespace {

constexpr int64_t kTile = 16;          // a tile: 16 rows of 16 f32 (C) or 16 bf16 pairs (A, B)
constexpr int64_t kBlock = 2 * kTile;  // C's blocks: 2 x 2 tiles

// Where C goes: element (m, n) at p[m*ld + n], or at p[n*ld + m] when transposed; added to
// what is there when accumulating.
struct Out {
  float* p;
  int64_t ld;
  bool transposed, accumulate;
  float* at(int64_t m, int64_t n) const { return transposed ? p + n * ld + m : p + m * ld + n; }
  Out from(int64_t m, int64_t n) const { return {at(m, n), ld, transposed, accumulate}; }
};

// r[j] = column j of the 16 x 16 block of 32-bit elements whose rows are r[i]: pairs of rows
// interleaved by 32 bits, then by 64, then the 128-bit lanes gathered in two steps.
inline void transpose16(__m512i (&r)[16]) {
  __m512i t[16], u[16];
  for (int i = 0; i < 16; i += 2) {
    t[i] = _mm512_unpacklo_epi32(r[i], r[i + 1]);
    t[i + 1] = _mm512_unpackhi_epi32(r[i], r[i + 1]);
  }
  // u[4g + c], lane L: column 4L + c of rows 4g .. 4g + 3.
  for (int g = 0; g < 16; g += 4) {
    u[g] = _mm512_unpacklo_epi64(t[g], t[g + 2]);
    u[g + 1] = _mm512_unpackhi_epi64(t[g], t[g + 2]);
    u[g + 2] = _mm512_unpacklo_epi64(t[g + 1], t[g + 3]);
    u[g + 3] = _mm512_unpackhi_epi64(t[g + 1], t[g + 3]);
  }
  for (int c = 0; c < 4; ++c) {
    const __m512i even01 = _mm512_shuffle_i32x4(u[c], u[4 + c], 0x88),
                  odd01 = _mm512_shuffle_i32x4(u[c], u[4 + c], 0xdd);
    const __m512i even23 = _mm512_shuffle_i32x4(u[8 + c], u[12 + c], 0x88),
                  odd23 = _mm512_shuffle_i32x4(u[8 + c], u[12 + c], 0xdd);
    r[c] = _mm512_shuffle_i32x4(even01, even23, 0x88);
    r[4 + c] = _mm512_shuffle_i32x4(odd01, odd23, 0x88);
    r[8 + c] = _mm512_shuffle_i32x4(even01, even23, 0xdd);
    r[12 + c] = _mm512_shuffle_i32x4(odd01, odd23, 0xdd);
  }
}

// A 16 x 16 f32 result tile (buf, row-major) into C^T at c (row stride ld).
void store_transposed(float* c, int64_t ld, const float* buf, bool accumulate) {
  __m512i r[16];
  for (int i = 0; i < 16; ++i) r[i] = _mm512_load_si512(buf + i * kTile);
  transpose16(r);
  for (int j = 0; j < 16; ++j) {
    __m512 v = _mm512_castsi512_ps(r[j]);
    if (accumulate) v = _mm512_add_ps(v, _mm512_loadu_ps(c + j * ld));
    _mm512_storeu_ps(c + j * ld, v);
  }
}

// Tiles 0-3 (the block's rows and columns in order) into the block at out. (GCC's tile
// intrinsics take the tile's number as a literal.)
void store_block(const Out& out) {
  if (!out.transposed) {
    const int64_t stride = out.ld * 4;
    _tile_stored(0, out.at(0, 0), stride);
    _tile_stored(1, out.at(0, kTile), stride);
    _tile_stored(2, out.at(kTile, 0), stride);
    _tile_stored(3, out.at(kTile, kTile), stride);
    return;
  }
  alignas(64) float buf[4][kTile * kTile];
  _tile_stored(0, buf[0], kTile * 4);
  _tile_stored(1, buf[1], kTile * 4);
  _tile_stored(2, buf[2], kTile * 4);
  _tile_stored(3, buf[3], kTile * 4);
  for (int t = 0; t < 4; ++t) store_transposed(out.at(t / 2 * kTile, t % 2 * kTile), out.ld, buf[t], out.accumulate);
}

// The packed operands (each tile 1 KB contiguous, loaded with a 64-byte stride):
// - TiledA (bf16): rows in groups of 16; group g's K in tiles of 16 rows x 32 values, tile t at
//   p + (g * tiles + t) * 512, tiles = K / 32 per group.
// - TiledB (pairs): columns in groups of 16; group g's row q (16 uint32) at p + (g * pairs + q) * 16.
constexpr int64_t kATile = kTile * 2 * kTile, kBRow = kTile;  // elements per A tile, per B row

// Four double accumulators of squares, eight lanes each.
struct Squares {
  __m512d acc[4] = {_mm512_setzero_pd(), _mm512_setzero_pd(), _mm512_setzero_pd(), _mm512_setzero_pd()};
  // The squares of the 32 x 32 block at out (plain, just stored).
  void add_block(const Out& out) {
    for (int64_t r = 0; r < kBlock; ++r)
      for (int h = 0; h < 2; ++h) {
        const __m512d v = _mm512_castps_pd(_mm512_loadu_ps(out.at(r, h * kTile)));
        const __m512d lo = _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_castpd512_pd256(v)));
        const __m512d hi = _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(v, 1)));
        acc[2 * h] = _mm512_fmadd_pd(lo, lo, acc[2 * h]);
        acc[2 * h + 1] = _mm512_fmadd_pd(hi, hi, acc[2 * h + 1]);
      }
  }
  double total() const {
    double s = 0.0;
    for (const __m512d& a : acc) s += _mm512_reduce_add_pd(a);
    return s;
  }
};

// One 32 x 32 block of C at out: tiles 0-3 start from out's values (a plain C that accumulates;
// a transposed one adds when stored) or zero, add `steps` products of 32 K values from A's tile
// streams a0, a1 (rows 0-15, 16-31) and B's b0, b1 (columns 0-15, 16-31), and are stored; their
// squares go into `squares` where given (a plain C).
void block(const Out& out, const uint16_t* a0, const uint16_t* a1, const uint32_t* b0, const uint32_t* b1,
           int64_t steps, Squares* squares) {
  if (out.accumulate && !out.transposed) {
    const int64_t stride = out.ld * 4;
    _tile_loadd(0, out.at(0, 0), stride);
    _tile_loadd(1, out.at(0, kTile), stride);
    _tile_loadd(2, out.at(kTile, 0), stride);
    _tile_loadd(3, out.at(kTile, kTile), stride);
  } else {
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
  }
  for (int64_t s = 0; s < steps; ++s) {
    _tile_loadd(4, a0 + s * kATile, 64);
    _tile_loadd(5, a1 + s * kATile, 64);
    _tile_loadd(6, b0 + s * kTile * kBRow, 64);
    _tile_loadd(7, b1 + s * kTile * kBRow, 64);
    _tile_dpbf16ps(0, 4, 6);
    _tile_dpbf16ps(1, 4, 7);
    _tile_dpbf16ps(2, 5, 6);
    _tile_dpbf16ps(3, 5, 7);
  }
  store_block(out);
  if (squares) squares->add_block(out);
}

// C[M, N] (+)= A[M, 2 pairs] @ B[2 pairs, N]: A a TiledA of M rows, B a TiledB of N columns, both
// of `pairs` pairs of K values; M, N multiples of 32, pairs of 16. The calling thread holds an
// AmxScope. Each block takes all of K at once: splitting K to keep A's tiles in L1 cost more in
// partial sums stored and loaded than it gained (measured: hot single-thread forward, K = 768).
void tile_loop(const Out& out, const uint16_t* a, const uint32_t* b, int64_t M, int64_t N, int64_t pairs,
               Squares* squares = nullptr) {
  const int64_t a_group = pairs / kTile * kATile, b_group = pairs * kBRow;
  for (int64_t m0 = 0; m0 < M; m0 += kBlock) {
    const uint16_t* a0 = a + m0 / kTile * a_group;
    for (int64_t n0 = 0; n0 < N; n0 += kBlock) {
      const uint32_t* b0 = b + n0 / kTile * b_group;
      block(out.from(m0, n0), a0, a0 + a_group, b0, b0 + b_group, pairs / kTile, squares);
    }
  }
}

// Rows [0, rows) of src (leading dimension ld), K values [0, K), as a TiledA.
void pack_a(uint16_t* dst, const uint16_t* src, int64_t ld, int64_t rows, int64_t K) {
  const int64_t tiles = K / (2 * kTile);
  for (int64_t g = 0; g < rows / kTile; ++g)
    for (int64_t t = 0; t < tiles; ++t)
      for (int64_t r = 0; r < kTile; ++r)
        std::memcpy(dst + (g * tiles + t) * kATile + r * 2 * kTile, src + (g * kTile + r) * ld + t * 2 * kTile, 64);
}

// B[q, n] = src[2q, n] | src[2q + 1, n] << 16 (src's rows in pairs, leading dimension ld) for
// q < pairs, n < cols, as a TiledB.
void pack_b_row_pairs(uint32_t* dst, const uint16_t* src, int64_t ld, int64_t pairs, int64_t cols) {
  for (int64_t q = 0; q < pairs; ++q) {
    const uint16_t *lo = src + 2 * q * ld, *hi = lo + ld;
    for (int64_t g = 0; g < cols / kTile; ++g) {
      uint32_t* d = dst + (g * pairs + q) * kBRow;
#pragma omp simd
      for (int64_t j = 0; j < kTile; ++j)
        d[j] = static_cast<uint32_t>(lo[g * kTile + j]) | static_cast<uint32_t>(hi[g * kTile + j]) << 16;
    }
  }
}

// r[j] = column j of the 16 x 16 block of 32-bit elements at src (row stride lds).
inline void load_transposed(__m512i (&r)[16], const uint32_t* src, int64_t lds) {
  for (int i = 0; i < 16; ++i) r[i] = _mm512_loadu_si512(src + i * lds);
  transpose16(r);
}

// x[N, C] as B = x^T in pairs along C, a TiledB of N columns: B[q, n] = x[n, 2q] | x[n, 2q + 1]
// << 16, a 32-bit transpose of x viewed as [N, C/2] uint32. The team's threads split C.
void pack_b_transposed_pairs(uint32_t* dst, const uint16_t* x, int64_t N, int64_t C) {
  const int64_t pairs = C / 2;
  const uint32_t* x32 = reinterpret_cast<const uint32_t*>(x);
#pragma omp for schedule(static)
  for (int64_t q0 = 0; q0 < pairs; q0 += kTile)
    for (int64_t n0 = 0; n0 < N; n0 += kTile) {
      __m512i r[16];
      load_transposed(r, x32 + n0 * pairs + q0, pairs);
      for (int j = 0; j < 16; ++j) _mm512_storeu_si512(dst + (n0 / kTile * pairs + q0 + j) * kBRow, r[j]);
    }
}

// A[o, n] = dy[n, o0 + o] for o < 32, n < N: 32 columns of dy (leading dimension ld; o0 and ld
// even) as the rows of a TiledA with K = N. A 32-bit transpose of column pairs, each pair then
// split into its two rows.
void pack_a_columns(uint16_t* dst, const uint16_t* dy, int64_t ld, int64_t o0, int64_t N) {
  const uint32_t* dy32 = reinterpret_cast<const uint32_t*>(dy + o0);
  const int64_t tiles = N / (2 * kTile);
  for (int64_t p0 = 0; p0 < kBlock / 2; p0 += kTile)
    for (int64_t n0 = 0; n0 < N; n0 += kTile) {
      __m512i r[16];
      load_transposed(r, dy32 + n0 * (ld / 2) + p0, ld / 2);
      for (int j = 0; j < 16; ++j) {
        const int64_t m = 2 * (p0 + j);  // the rows m (low halves) and m + 1 (high halves)
        uint16_t* row =
            dst + (m / kTile * tiles + n0 / (2 * kTile)) * kATile + m % kTile * 2 * kTile + n0 % (2 * kTile);
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(row), _mm512_cvtepi32_epi16(r[j]));
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(row + 2 * kTile),
                            _mm512_cvtepi32_epi16(_mm512_srli_epi32(r[j], 16)));
      }
    }
}

}  // namespace

bool amx_linear_fits(int64_t N, int64_t C, int64_t OC) {
  return N > 0 && N % kBlock == 0 && C > 0 && C % kBlock == 0 && OC > 0 && OC % kBlock == 0 &&
         amx_available();
}

void amx_linear_forward(float* y, int64_t ldy, const uint16_t* x, const uint16_t* w, int64_t N, int64_t C,
                        int64_t OC, bool accumulate) {
  uint32_t* xt = static_cast<uint32_t*>(workspace(Workspace::ExpandA, static_cast<size_t>(N * C) * 2));
#pragma omp parallel
  {
    pack_b_transposed_pairs(xt, x, N, C);
    AmxScope amx;
    uint16_t* wt = static_cast<uint16_t*>(workspace(Workspace::ExpandB, static_cast<size_t>(kBlock * C) * 2));
#pragma omp for schedule(static)
    for (int64_t o0 = 0; o0 < OC; o0 += kBlock) {
      pack_a(wt, w + o0 * C, C, kBlock, C);
      tile_loop({y + o0, ldy, true, accumulate}, wt, xt, kBlock, N, C / 2);
    }
  }
}

void amx_linear_dweight(float* dw, const uint16_t* dy, int64_t lddy, const uint16_t* x, int64_t N, int64_t C,
                        int64_t OC, bool accumulate, double* squares) {
  uint32_t* xp = static_cast<uint32_t*>(workspace(Workspace::ExpandA, static_cast<size_t>(N * C) * 2));
  constexpr int kMaxThreads = 1024;
  double partial[kMaxThreads] = {};  // each thread's sum of squares, added in thread order below
  const int threads = omp_get_max_threads();
  TESSERA_CHECK(!squares || threads <= kMaxThreads, "amx_linear_dweight: more than 1024 threads");
#pragma omp parallel
  {
#pragma omp for schedule(static)
    for (int64_t c0 = 0; c0 < C; c0 += kTile) pack_b_row_pairs(xp + c0 * (N / 2), x + c0, C, N / 2, kTile);
    AmxScope amx;
    uint16_t* dyt = static_cast<uint16_t*>(workspace(Workspace::ExpandB, static_cast<size_t>(kBlock * N) * 2));
    Squares mine;
#pragma omp for schedule(static)
    for (int64_t o0 = 0; o0 < OC; o0 += kBlock) {
      pack_a_columns(dyt, dy, lddy, o0, N);
      tile_loop({dw + o0 * C, C, false, accumulate}, dyt, xp, kBlock, C, N / 2, squares ? &mine : nullptr);
    }
    if (squares) partial[omp_get_thread_num()] = mine.total();
  }
  if (squares)
    for (int t = 0; t < threads; ++t) *squares += partial[t];
}

#else

bool amx_linear_fits(int64_t, int64_t, int64_t) { return false; }

#define TESSERA_NO_AMX_GEMM(name) \
  TESSERA_CHECK(false, #name ": this build has no AMX-BF16 kernels (amx_linear_fits is false)")
void amx_linear_forward(float*, int64_t, const uint16_t*, const uint16_t*, int64_t, int64_t, int64_t, bool) {
  TESSERA_NO_AMX_GEMM(amx_linear_forward);
}
void amx_linear_dweight(float*, const uint16_t*, int64_t, const uint16_t*, int64_t, int64_t, int64_t, bool,
                        double*) {
  TESSERA_NO_AMX_GEMM(amx_linear_dweight);
}

#endif

}  // namespace tessera::ops::cpu
