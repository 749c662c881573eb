// Row-major single-precision GEMM, C[M,N] = alpha * op(A)[M,K] @ op(B)[K,N] + beta * C,
// with op(X) = X or X^T as stored row-major with leading dimension ldX (BLAS semantics:
// beta == 0 ignores C's old contents, even NaN).
//   sgemm:           oneDNN's dnnl_sgemm (JIT AVX-512 kernels, OpenMP threads); the fast path.
//   sgemm_reference: a triple loop accumulating in double; slow and obviously right, kept
//                    in every build to test the fast path against.
//   gemm_bf16:       the same with bfloat16 operands (raw bits, as BF16 tensors hold
//                    them) and f32 C, accumulation in f32 (Megatron's --bf16 GEMMs).
#pragma once

#include <cstdint>

namespace tessera::ops::cpu {

void sgemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const float* A,
           int64_t lda, const float* B, int64_t ldb, float beta, float* C, int64_t ldc);

// C (f32) = alpha * op(A) @ op(B) + beta * C for bfloat16 A and B. Through a oneDNN
// matmul primitive (bf16 src/weights, f32 dst; alpha as output scale, beta as a sum
// post-op) when this CPU has a oneDNN bf16 kernel (AVX512-BF16 / AMX, or AVX-512 with
// oneDNN's emulation) for the shape; otherwise the operands are expanded to f32 (exact)
// into workspaces and multiplied by sgemm. Both are products of bf16 values (exact in
// f32) summed in f32: they differ only in summation order (and the bf16 instructions
// treat subnormal inputs as zero). Primitives are cached per calling thread and shape.
void gemm_bf16(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const uint16_t* A,
               int64_t lda, const uint16_t* B, int64_t ldb, float beta, float* C, int64_t ldc);

// Whether this CPU has a oneDNN bf16 matmul kernel (not oneDNN's reference loops); probed
// once. False on AVX2-only CPUs: oneDNN 2.6 has bf16 kernels only from AVX-512 on.
bool onednn_bf16_available();
// The implementation oneDNN picks for a bf16 matmul (e.g. "brg:avx512_core_bf16"), or
// "none" when there is none but its reference; for benchmarks and logs.
const char* onednn_bf16_impl();
// Whether the linear multiplies BF16 tensors through oneDNN's bf16 GEMM (default: whenever
// onednn_bf16_available()) or through sgemm on operands widened to f32 (same
// arithmetic, see above). Tests and benchmarks switch it off to compare the two;
// returns the previous setting. Global, not thread-safe against running linears.
bool set_bf16_use_onednn(bool use);
bool bf16_uses_onednn();  // the setting AND onednn_bf16_available()

void sgemm_reference(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
                     const float* A, int64_t lda, const float* B, int64_t ldb, float beta, float* C,
                     int64_t ldc);

}  // namespace tessera::ops::cpu
