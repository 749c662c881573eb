// The reference GEMM: three loops and a double accumulator, nothing clever. Only tests and
// debugging call it; its one job is to be obviously right.
#include "tessera/ops/cpu/gemm.h"

namespace tessera::ops::cpu {

void sgemm_reference(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
                     const float* A, int64_t lda, const float* B, int64_t ldb, float beta, float* C,
                     int64_t ldc) {
  for (int64_t i = 0; i < M; ++i) {
    for (int64_t j = 0; j < N; ++j) {
      double acc = 0.0;
      for (int64_t k = 0; k < K; ++k) {
        const double a = trans_a ? A[k * lda + i] : A[i * lda + k];
        const double b = trans_b ? B[j * ldb + k] : B[k * ldb + j];
        acc += a * b;
      }
      double c = static_cast<double>(alpha) * acc;
      if (beta != 0.0f) c += static_cast<double>(beta) * C[i * ldc + j];
      C[i * ldc + j] = static_cast<float>(c);
    }
  }
}

}  // namespace tessera::ops::cpu
