// Row-major single-precision GEMM, C[M,N] = alpha * op(A)[M,K] @ op(B)[K,N] + beta * C,
// with op(X) = X or X^T as stored row-major with leading dimension ldX (BLAS semantics:
// beta == 0 ignores C's old contents, even NaN).
//   sgemm:           oneDNN's dnnl_sgemm (JIT AVX-512 kernels, OpenMP threads); the fast path.
//   sgemm_reference: a triple loop accumulating in double; slow and obviously right, kept
//                    in every build to test the fast path against.
#pragma once

#include <cstdint>

namespace tessera::ops::cpu {

void sgemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const float* A,
           int64_t lda, const float* B, int64_t ldb, float beta, float* C, int64_t ldc);

void sgemm_reference(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
                     const float* A, int64_t lda, const float* B, int64_t ldb, float beta, float* C,
                     int64_t ldc);

}  // namespace tessera::ops::cpu
