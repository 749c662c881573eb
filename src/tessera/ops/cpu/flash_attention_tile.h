// The tile product of the fused attention's CPU kernel (flash_attention.cpp): every product of
// a tile (scores Q K^T, probabilities times values, and the backward's four) is one call of
//   C[M,N] (+)= alpha * A[M,K] B[K,N],  N a multiple of kVec,
// a register-blocked micro-kernel of up to 6 rows by up to 4 vectors of C: each step loads the
// row of B once and broadcasts one A element per row, so 24 multiply-adds take 4 loads and 6
// broadcasts.
// Two kinds of operands:
// - f32 (F32A, F32B): A read through strides (so A^T costs nothing), B row-major; written with
//   GCC's vector extension: AVX-512 registers where the build targets them (-march=native
//   here), two AVX2 registers per vector elsewhere, the same source for both;
// - bfloat16 (Bf16A, PairB): A row-major bf16, B in pairs of rows (VNNI: one 32-bit element
//   holds B[2p, n] in its low and B[2p+1, n] in its high half), K counted in pairs; AMX's
//   TDPBF16PS multiplies the bf16 values exactly and accumulates in f32 (FlashAttention's bf16
//   products; the Product16 class of ops.inc), 16 x 16 blocks of C (flash_attention_amx.cpp).
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>

namespace tessera::ops::cpu::flash {

constexpr int64_t kVec = 16;  // floats per vector (one AVX-512 register)
typedef float Vec __attribute__((vector_size(kVec * sizeof(float))));
typedef int32_t IVec __attribute__((vector_size(kVec * sizeof(int32_t))));  // Vec's lanes as integers

inline Vec load(const float* p) {
  Vec v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
inline void store(float* p, Vec v) { std::memcpy(p, &v, sizeof v); }

// f32 A: element (m, k) at p[m*rs + k*cs].
struct F32A {
  const float* p;
  int64_t rs, cs;
  F32A rows(int64_t m) const { return {p + m * rs, rs, cs}; }
  F32A from_k(int64_t k) const { return {p + k * cs, rs, cs}; }
};
// f32 B: element (k, n) at p[k*ld + n].
struct F32B {
  const float* p;
  int64_t ld;
  F32B cols(int64_t n) const { return {p + n, ld}; }
  F32B from_k(int64_t k) const { return {p + k * ld, ld}; }
};

// C's rows [0, MR) and vectors [0, NV) of c (row stride ldc) = alpha * the product over K, or
// that added to them (Accumulate).
template <int MR, int NV, bool Accumulate>
inline void store_block(float* c, int64_t ldc, const Vec (&acc)[MR][NV], float alpha) {
  for (int m = 0; m < MR; ++m)
    for (int n = 0; n < NV; ++n) {
      float* p = c + m * ldc + n * kVec;
      const Vec r = alpha * acc[m][n];
      store(p, Accumulate ? load(p) + r : r);
    }
}

// acc[m][n] = the product over K of A's rows [0, MR) and B's vectors [0, NV): the micro-kernel.
template <int MR, int NV>
inline void product_block(Vec (&acc)[MR][NV], F32A a, F32B b, int64_t K) {
  for (int m = 0; m < MR; ++m)
    for (int n = 0; n < NV; ++n) acc[m][n] = Vec{};
  for (int64_t k = 0; k < K; ++k) {
    Vec bv[NV];
    for (int n = 0; n < NV; ++n) bv[n] = load(b.p + k * b.ld + n * kVec);
    for (int m = 0; m < MR; ++m) {
      const float am = a.p[m * a.rs + k * a.cs];
      for (int n = 0; n < NV; ++n) acc[m][n] += am * bv[n];
    }
  }
}

// tile_block, tile_rows and band_rows are always inlined into tile_product: as calls, their
// operand structs went through the stack, and the callee reading one back as a 16-byte load
// from two 8-byte stores missed store forwarding, a stall per block of rows (~2 % of the
// backward).
template <int MR, int NV, bool Accumulate>
[[gnu::always_inline]] inline void tile_block(float* c, int64_t ldc, F32A a, F32B b, int64_t K, float alpha) {
  Vec acc[MR][NV];
  product_block(acc, a, b, K);
  store_block<MR, NV, Accumulate>(c, ldc, acc, alpha);
}

// Lane-wise max (NaN-free operands), and the max and sum of a vector's lanes as a tree of
// halves (a loop's `omp simd reduction` ends in 15 dependent scalar steps instead).
static_assert(kVec == 16, "the reductions' shuffles name 16 lanes");
inline Vec max(Vec a, Vec b) { return a > b ? a : b; }
inline float reduce_max(Vec v) {
  typedef float Half __attribute__((vector_size(kVec / 2 * sizeof(float))));
  typedef float Quarter __attribute__((vector_size(kVec / 4 * sizeof(float))));
  Half h = __builtin_shufflevector(v, v, 0, 1, 2, 3, 4, 5, 6, 7);
  const Half h2 = __builtin_shufflevector(v, v, 8, 9, 10, 11, 12, 13, 14, 15);
  h = h > h2 ? h : h2;
  Quarter q = __builtin_shufflevector(h, h, 0, 1, 2, 3);
  const Quarter q2 = __builtin_shufflevector(h, h, 4, 5, 6, 7);
  q = q > q2 ? q : q2;
  const float a = q[0] > q[2] ? q[0] : q[2], b = q[1] > q[3] ? q[1] : q[3];
  return a > b ? a : b;
}
inline float reduce_add(Vec v) {
  typedef float Half __attribute__((vector_size(kVec / 2 * sizeof(float))));
  typedef float Quarter __attribute__((vector_size(kVec / 4 * sizeof(float))));
  const Half h = __builtin_shufflevector(v, v, 0, 1, 2, 3, 4, 5, 6, 7) +
                 __builtin_shufflevector(v, v, 8, 9, 10, 11, 12, 13, 14, 15);
  const Quarter q = __builtin_shufflevector(h, h, 0, 1, 2, 3) + __builtin_shufflevector(h, h, 4, 5, 6, 7);
  return (q[0] + q[2]) + (q[1] + q[3]);
}

// bf16 A, row-major: element (m, k) at p[m*ld + k]; ld even.
struct Bf16A {
  const uint16_t* p;
  int64_t ld;
};
// B in pairs of rows: p[q*ld + n] holds B[2q, n] (low half) and B[2q+1, n] (high half).
struct PairB {
  const uint32_t* p;
  int64_t ld;
};

// The bf16 products' blocks: 16 rows of C by 16 columns, K in steps of kPairStep pairs (32
// bf16 values: one AMX tile row). Callers pad: K a multiple of kPairStep, zeros in A's and B's
// padding; A's rows up to M rounded up to 16 readable (their products are discarded).
constexpr int64_t kBlockRows = 16, kPairStep = 16;

// C[m, n] (+)= alpha * sum_k A(m, k) B(k, n) for m < M, n < N (a multiple of 16), k < 2K (K
// pairs, a multiple of kPairStep), f32 accumulation of the exact bf16 products (TDPBF16PS,
// inside an AmxScope, amx.h). Accumulate adds into C; otherwise C is set.
template <bool Accumulate>
void tile_product_bf16(float* c, int64_t ldc, Bf16A a, PairB b, int64_t M, int64_t N, int64_t K,
                       float alpha = 1.0f);

// The causal band of a tile product (the diagonal tiles of flash_attention.cpp, where a query
// sees only the keys up to its position): row m of C needs only k in [m + k_lo, m + k_hi] and
// columns n <= m + n_hi. A block of rows multiplies the union of its rows' ranges, columns in
// whole vectors; C's elements outside the band are left as they were (their products are 0 by
// the caller's mask, or never read). The default band is all of K and N.
struct Band {
  static constexpr int64_t kAll = int64_t{1} << 40;
  int64_t k_lo = -kAll, k_hi = kAll, n_hi = kAll;
};

template <int MR, bool Accumulate, class A, class B>
[[gnu::always_inline]] inline void tile_rows(float* c, int64_t ldc, A a, B b, int64_t N, int64_t K, float alpha) {
  int64_t n0 = 0;
  for (; n0 + 4 * kVec <= N; n0 += 4 * kVec) tile_block<MR, 4, Accumulate>(c + n0, ldc, a, b.cols(n0), K, alpha);
  switch ((N - n0) / kVec) {
    case 3: tile_block<MR, 3, Accumulate>(c + n0, ldc, a, b.cols(n0), K, alpha); break;
    case 2: tile_block<MR, 2, Accumulate>(c + n0, ldc, a, b.cols(n0), K, alpha); break;
    case 1: tile_block<MR, 1, Accumulate>(c + n0, ldc, a, b.cols(n0), K, alpha); break;
    default: break;
  }
}

// Rows [m, m + MR) of the product within the band.
template <int MR, bool Accumulate>
[[gnu::always_inline]] inline void band_rows(float* c, int64_t ldc, F32A a, F32B b, int64_t m, int64_t N, int64_t K, Band band,
                      float alpha) {
  const int64_t k0 = std::max<int64_t>(0, m + band.k_lo), k1 = std::min(K, m + MR - 1 + band.k_hi + 1);
  const int64_t n1 = std::min(N, (m + MR - 1 + band.n_hi + kVec) / kVec * kVec);
  if (n1 <= 0) return;
  tile_rows<MR, Accumulate>(c + m * ldc, ldc, a.rows(m).from_k(k0), b.from_k(k0), n1, std::max<int64_t>(0, k1 - k0),
                            alpha);
}

// C[m, n] (+)= alpha * sum_k A(m, k) B(k, n) for m < M, n < N (a multiple of kVec), k < K, within
// `band`. Accumulate adds into C; otherwise C is set. Blocks of 6 rows by 4 vectors (24
// accumulators, the B row's 4 vectors and the broadcast A element: 29 of the 32 registers; 7
// rows spill one) run the FMA ports ~10 % closer to their peak than 4 rows; the last rows go 4
// and then 1 at a time.
// Every element's sum runs over k in ascending order whatever the blocking.
template <bool Accumulate>
inline void tile_product(float* c, int64_t ldc, F32A a, F32B b, int64_t M, int64_t N, int64_t K, float alpha = 1.0f,
                         Band band = {}) {
  constexpr int kRows = 6;
  int64_t m = 0;
  for (; M - m > 2 * 4 || M - m == kRows; m += kRows) band_rows<kRows, Accumulate>(c, ldc, a, b, m, N, K, band, alpha);
  for (; m + 4 <= M; m += 4) band_rows<4, Accumulate>(c, ldc, a, b, m, N, K, band, alpha);
  for (; m < M; ++m) band_rows<1, Accumulate>(c, ldc, a, b, m, N, K, band, alpha);
}

}  // namespace tessera::ops::cpu::flash
