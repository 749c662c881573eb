// The fast GEMM: oneDNN's sgemm. It is row-major (unlike BLAS), takes 'N'/'T' per operand
// and runs on the OpenMP runtime, so it shares our kernels' thread pool and
// OMP_NUM_THREADS.
#include "tessera/ops/cpu/gemm.h"

#include <oneapi/dnnl/dnnl.h>

#include <string>

#include "tessera/core/error.h"

namespace tessera::ops::cpu {

void sgemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const float* A,
           int64_t lda, const float* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  TESSERA_CHECK(M >= 0 && N >= 0 && K >= 0, "negative GEMM size");
  if (M == 0 || N == 0) return;
  if (K == 0) {  // nothing to multiply; C = beta * C (oneDNN may reject K == 0)
    for (int64_t i = 0; i < M; ++i)
      for (int64_t j = 0; j < N; ++j) C[i * ldc + j] = beta == 0.0f ? 0.0f : beta * C[i * ldc + j];
    return;
  }
  dnnl_status_t status = dnnl_sgemm(trans_a ? 'T' : 'N', trans_b ? 'T' : 'N', M, N, K, alpha, A, lda, B, ldb,
                                    beta, C, ldc);
  TESSERA_CHECK(status == dnnl_success, "dnnl_sgemm failed with status " + std::to_string(status) + " for M=" +
                                            std::to_string(M) + " N=" + std::to_string(N) + " K=" +
                                            std::to_string(K));
}

}  // namespace tessera::ops::cpu
