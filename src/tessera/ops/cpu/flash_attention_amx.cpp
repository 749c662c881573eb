// The fused attention's bf16 tile products on AMX (flash_attention_tile.h): C blocks of 16 x 16
// f32 in tile registers, two by two (tiles 0-3), A's 16-row blocks in tiles 4-5 and B's
// 16-column blocks in tiles 6-7, one TDPBF16PS per pair of blocks and 32 bf16 values of K.
// A build without AMX-BF16 has a plain loop instead (the same sums, never chosen by the
// kernel there: amx_available() is false).
#include <algorithm>
#include <cstdint>

#include "tessera/core/dtype.h"
#include "tessera/ops/cpu/flash_attention_tile.h"

#if defined(__AMX_TILE__) && defined(__AMX_BF16__) && defined(__linux__)
#include <immintrin.h>
#define TESSERA_AMX 1
#endif

namespace tessera::ops::cpu::flash {

#if defined(TESSERA_AMX)
namespace {

// C rows [m0, m0 + 16) and columns [n0, n0 + 16) of c from tile `block` (stored to buf), rows
// below M only.
template <bool Accumulate>
void store_rows(float* c, int64_t ldc, const float* buf, int64_t m0, int64_t n0, int64_t M, float alpha) {
  const int64_t rows = std::min<int64_t>(kBlockRows, M - m0);
  for (int64_t r = 0; r < rows; ++r) {
    float* out = c + (m0 + r) * ldc + n0;
    const float* in = buf + r * 16;
#pragma omp simd
    for (int64_t j = 0; j < 16; ++j) out[j] = Accumulate ? out[j] + alpha * in[j] : alpha * in[j];
  }
}

// MB x NB blocks of C (MB, NB in {1, 2}) at rows m0 and columns n0.
template <int MB, int NB, bool Accumulate>
void blocks(float* c, int64_t ldc, Bf16A a, PairB b, int64_t m0, int64_t n0, int64_t M, int64_t K, float alpha) {
  const int64_t a_stride = a.ld * 2, b_stride = b.ld * 4;  // bytes per row
  _tile_zero(0);
  if constexpr (NB == 2) _tile_zero(1);
  if constexpr (MB == 2) _tile_zero(2);
  if constexpr (MB == 2 && NB == 2) _tile_zero(3);
  for (int64_t q = 0; q < K; q += kPairStep) {
    _tile_loadd(4, a.p + m0 * a.ld + 2 * q, a_stride);
    if constexpr (MB == 2) _tile_loadd(5, a.p + (m0 + kBlockRows) * a.ld + 2 * q, a_stride);
    _tile_loadd(6, b.p + q * b.ld + n0, b_stride);
    if constexpr (NB == 2) _tile_loadd(7, b.p + q * b.ld + n0 + 16, b_stride);
    _tile_dpbf16ps(0, 4, 6);
    if constexpr (NB == 2) _tile_dpbf16ps(1, 4, 7);
    if constexpr (MB == 2) _tile_dpbf16ps(2, 5, 6);
    if constexpr (MB == 2 && NB == 2) _tile_dpbf16ps(3, 5, 7);
  }
  alignas(64) float buf[16 * 16];
  _tile_stored(0, buf, 64);
  store_rows<Accumulate>(c, ldc, buf, m0, n0, M, alpha);
  if constexpr (NB == 2) {
    _tile_stored(1, buf, 64);
    store_rows<Accumulate>(c, ldc, buf, m0, n0 + 16, M, alpha);
  }
  if constexpr (MB == 2) {
    _tile_stored(2, buf, 64);
    store_rows<Accumulate>(c, ldc, buf, m0 + kBlockRows, n0, M, alpha);
  }
  if constexpr (MB == 2 && NB == 2) {
    _tile_stored(3, buf, 64);
    store_rows<Accumulate>(c, ldc, buf, m0 + kBlockRows, n0 + 16, M, alpha);
  }
}

template <int MB, bool Accumulate>
void block_row(float* c, int64_t ldc, Bf16A a, PairB b, int64_t m0, int64_t M, int64_t N, int64_t K, float alpha) {
  int64_t n0 = 0;
  for (; n0 + 32 <= N; n0 += 32) blocks<MB, 2, Accumulate>(c, ldc, a, b, m0, n0, M, K, alpha);
  if (n0 < N) blocks<MB, 1, Accumulate>(c, ldc, a, b, m0, n0, M, K, alpha);
}

}  // namespace

template <bool Accumulate>
void tile_product_bf16(float* c, int64_t ldc, Bf16A a, PairB b, int64_t M, int64_t N, int64_t K, float alpha) {
  int64_t m0 = 0;
  for (; m0 + kBlockRows < M; m0 += 2 * kBlockRows) block_row<2, Accumulate>(c, ldc, a, b, m0, M, N, K, alpha);
  if (m0 < M) block_row<1, Accumulate>(c, ldc, a, b, m0, M, N, K, alpha);
}

#else

template <bool Accumulate>
void tile_product_bf16(float* c, int64_t ldc, Bf16A a, PairB b, int64_t M, int64_t N, int64_t K, float alpha) {
  for (int64_t m = 0; m < M; ++m)
    for (int64_t n = 0; n < N; ++n) {
      float sum = 0.0f;
      for (int64_t q = 0; q < K; ++q) {
        const uint32_t pair = b.p[q * b.ld + n];
        sum += bf16_to_f32(a.p[m * a.ld + 2 * q]) * bf16_to_f32(static_cast<uint16_t>(pair)) +
               bf16_to_f32(a.p[m * a.ld + 2 * q + 1]) * bf16_to_f32(static_cast<uint16_t>(pair >> 16));
      }
      float& out = c[m * ldc + n];
      out = Accumulate ? out + alpha * sum : alpha * sum;
    }
}

#endif

template void tile_product_bf16<false>(float*, int64_t, Bf16A, PairB, int64_t, int64_t, int64_t, float);
template void tile_product_bf16<true>(float*, int64_t, Bf16A, PairB, int64_t, int64_t, int64_t, float);

}  // namespace tessera::ops::cpu::flash
