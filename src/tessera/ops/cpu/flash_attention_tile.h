// The tile product of the fused attention's CPU kernel (flash_attention.cpp): every product of
// a tile (scores Q K^T, probabilities times values, and the backward's four) is one call of
//   C[M,N] (+)= alpha * A[M,K] B[K,N],  A read through strides (so A^T costs nothing),
//   B row-major with N a multiple of kVec,
// a register-blocked micro-kernel of kRows rows by up to 4 vectors of C: each step loads the
// row of B once and broadcasts one A element per row, so 16 FMAs take 4 loads. Written with
// GCC's vector extension: AVX-512 registers where the build targets them (-march=native here),
// two AVX2 registers per vector elsewhere, the same source for both.
#pragma once

#include <cstdint>
#include <cstring>

namespace tessera::ops::cpu::flash {

constexpr int64_t kVec = 16;  // floats per vector (one AVX-512 register)
typedef float Vec __attribute__((vector_size(kVec * sizeof(float))));

inline Vec load(const float* p) {
  Vec v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
inline void store(float* p, Vec v) { std::memcpy(p, &v, sizeof v); }

// Rows [0, MR) and vectors [0, NV) of C at (c, ldc), over k < K.
template <int MR, int NV, bool Accumulate>
inline void tile_block(float* c, int64_t ldc, const float* a, int64_t a_rs, int64_t a_cs, const float* b, int64_t ldb,
                       int64_t K, float alpha) {
  Vec acc[MR][NV];
  for (int m = 0; m < MR; ++m)
    for (int n = 0; n < NV; ++n) acc[m][n] = Vec{};
  for (int64_t k = 0; k < K; ++k) {
    Vec bv[NV];
    for (int n = 0; n < NV; ++n) bv[n] = load(b + k * ldb + n * kVec);
    for (int m = 0; m < MR; ++m) {
      const float am = a[m * a_rs + k * a_cs];
      for (int n = 0; n < NV; ++n) acc[m][n] += am * bv[n];
    }
  }
  for (int m = 0; m < MR; ++m)
    for (int n = 0; n < NV; ++n) {
      float* p = c + m * ldc + n * kVec;
      const Vec r = alpha * acc[m][n];
      store(p, Accumulate ? load(p) + r : r);
    }
}

template <int MR, bool Accumulate>
inline void tile_rows(float* c, int64_t ldc, const float* a, int64_t a_rs, int64_t a_cs, const float* b, int64_t ldb,
                      int64_t N, int64_t K, float alpha) {
  int64_t n0 = 0;
  for (; n0 + 4 * kVec <= N; n0 += 4 * kVec)
    tile_block<MR, 4, Accumulate>(c + n0, ldc, a, a_rs, a_cs, b + n0, ldb, K, alpha);
  switch ((N - n0) / kVec) {
    case 3: tile_block<MR, 3, Accumulate>(c + n0, ldc, a, a_rs, a_cs, b + n0, ldb, K, alpha); break;
    case 2: tile_block<MR, 2, Accumulate>(c + n0, ldc, a, a_rs, a_cs, b + n0, ldb, K, alpha); break;
    case 1: tile_block<MR, 1, Accumulate>(c + n0, ldc, a, a_rs, a_cs, b + n0, ldb, K, alpha); break;
    default: break;
  }
}

// C[m, n] (+)= alpha * sum_k A[m*a_rs + k*a_cs] * B[k*ldb + n] for m < M, n < N (a multiple of
// kVec), k < K. Accumulate adds into C; otherwise C is set.
template <bool Accumulate>
inline void tile_product(float* c, int64_t ldc, const float* a, int64_t a_rs, int64_t a_cs, const float* b,
                         int64_t ldb, int64_t M, int64_t N, int64_t K, float alpha = 1.0f) {
  constexpr int kRows = 4;
  int64_t m = 0;
  for (; m + kRows <= M; m += kRows)
    tile_rows<kRows, Accumulate>(c + m * ldc, ldc, a + m * a_rs, a_rs, a_cs, b, ldb, N, K, alpha);
  for (; m < M; ++m) tile_rows<1, Accumulate>(c + m * ldc, ldc, a + m * a_rs, a_rs, a_cs, b, ldb, N, K, alpha);
}

}  // namespace tessera::ops::cpu::flash
