// The cache of cuBLASLt GEMM plans (ops/cuda/linear.cpp). Planning a GEMM (a matmul
// descriptor, three matrix layouts, a preference and cublasLtMatmulAlgoGetHeuristic) costs
// far more host time than enqueueing it, and a training step multiplies the same few shapes
// every time; so each distinct GEMM is planned once, on first use, and kept for the process.
// No CUDA types here, so the key logic is tested on the CPU
// (tests/unit/ops/cuda_gemm_plan_test.cpp).
#pragma once

#include <algorithm>
#include <compare>
#include <cstdint>
#include <map>
#include <memory>

namespace tessera::ops::cuda {

// Everything a plan depends on. Pointers are not part of it (they are passed to each
// cublasLtMatmul; the bias pointer is set on the cached descriptor per call), but their
// alignments are: the heuristic may pick a kernel that needs the alignment it was told.
struct GemmKey {
  int compute = 0;  // cublasComputeType_t: 32F (exact f32), or 32F_FAST_TF32 under --tf32
  int ab = 0;       // cudaDataType_t of both operands
  int ct = 0;       // cudaDataType_t of C and D
  bool ta = false, tb = false;
  bool bias = false;  // CUBLASLT_EPILOGUE_BIAS
  int64_t M = 0, N = 0, K = 0, lda = 0, ldb = 0, ldc = 0;
  uint32_t align_a = 0, align_b = 0, align_c = 0;  // batch_alignment of each operand, in bytes
  // A strided batch (cuBLASLt's BATCH_COUNT, STRIDED_BATCH_OFFSET): `batch` GEMMs, the i-th
  // on A + i*stride_a, B + i*stride_b, C + i*stride_c (in elements). 1 and 0s: one GEMM.
  int64_t batch = 1, stride_a = 0, stride_b = 0, stride_c = 0;
  // CUBLASLT_EPILOGUE_GELU_AUX(_BIAS): D = gelu(product (+ bias)), the pre-activation into an
  // aux matrix of D's type and leading dimension ldc (linear_bias_gelu_forward's pre).
  bool gelu_aux = false;

  auto operator<=>(const GemmKey&) const = default;
};

// The largest power of two up to 256 dividing the address: the alignment cuBLASLt may
// assume (it assumes 256 bytes unless told). Null counts as 256.
inline uint32_t alignment_of(const void* p) {
  const auto a = reinterpret_cast<uintptr_t>(p);
  return a == 0 ? 256u : static_cast<uint32_t>(std::min<uintptr_t>(256, a & -a));
}

// The alignment every matrix of a strided batch has: that of the first one's address and
// of the stride between them (stride_bytes; 0 for no batch).
inline uint32_t batch_alignment(const void* p, uint64_t stride_bytes) {
  return std::min(alignment_of(p), alignment_of(reinterpret_cast<const void*>(stride_bytes)));
}

// Plans by key, each made once by `make` (a function returning std::unique_ptr<Plan>).
// Not locked: its owner holds the lock under which plans are made and used.
template <typename Plan>
class PlanCache {
 public:
  template <typename Make>
  Plan& get(const GemmKey& key, Make&& make) {
    auto it = plans_.find(key);
    if (it == plans_.end()) it = plans_.emplace(key, make()).first;
    return *it->second;
  }
  size_t size() const { return plans_.size(); }

 private:
  std::map<GemmKey, std::unique_ptr<Plan>> plans_;
};

}  // namespace tessera::ops::cuda
