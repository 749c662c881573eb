// GEMMs through cuBLASLt on a CUDA device, shared by the ops that multiply matrices
// (linear.cpp, attention.cpp): one cuBLASLt handle, workspace and plan cache (gemm_plan.h)
// per device, every call checked. f32 operands multiply with f32 accumulation
// (CUBLAS_COMPUTE_32F: exact f32), or with TF32 operands when the device allows it (--tf32,
// device.h's set_tf32_matmul).
#pragma once

#include <library_types.h>

#include <cstdint>

#include "tessera/core/tensor.h"
#include "tessera/device/device.h"

namespace tessera::ops::cuda {

// cuBLASLt's type of a storage dtype (F32, BF16, F16).
cudaDataType_t lt_type(DType t);

// A strided batch of equally shaped GEMMs (gemm_plan.h's GemmKey): count GEMMs, the i-th
// on A + i*stride_a, B + i*stride_b, C + i*stride_c (in elements).
struct GemmBatch {
  int64_t count = 1, stride_a = 0, stride_b = 0, stride_c = 0;
};

// Row-major C[M,N] (of type ct, leading dimension ldc) = op(A)[M,K] @ op(B)[K,N] + beta * C
// (+ bias[N] of C's type when given), A and B of type ab (leading dimensions lda, ldb as
// stored: op(A) = A^T when ta, A then stored [K,M]), for each GEMM of `batch`. Enqueued on
// the device's stream. With gelu_aux (one GEMM, beta 0): C = gelu_tanh(product + bias) and
// gelu_aux[M,N] (C's type, leading dimension ldc) = product + bias, in cuBLASLt's
// GELU_AUX(_BIAS) epilogue.
void gemm(Device& device, cudaDataType_t ab, bool ta, bool tb, int64_t M, int64_t N, int64_t K, const void* A,
          int64_t lda, const void* B, int64_t ldb, float beta, void* C, int64_t ldc, const void* bias = nullptr,
          cudaDataType_t ct = CUDA_R_32F, const GemmBatch& batch = {}, void* gelu_aux = nullptr);

// out[N,OC] = inp[N,C] @ weight[OC,C]^T (+ bias[OC]) in one GEMM: linear's forward where
// cuBLASLt takes the call as it is (inp and weight of one dtype, multiplied natively; bias,
// when present, of out's dtype), and the GeLU epilogue's: with gelu_aux (of out's shape and
// dtype), gelu_aux = that and out = its tanh GeLU, cuBLASLt's GELU_AUX(_BIAS).
void linear_gemm(const Tensor& out, const Tensor& inp, const Tensor& weight, const Tensor& bias,
                 const Tensor& gelu_aux = Tensor());

}  // namespace tessera::ops::cuda
