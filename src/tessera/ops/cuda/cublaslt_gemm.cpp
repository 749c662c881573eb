#include "tessera/ops/cuda/cublaslt_gemm.h"

#include <cublasLt.h>

#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "tessera/device/cuda/cuda_stream.h"
#include "tessera/ops/cuda/cuda_launch.h"
#include "tessera/ops/cuda/gemm_plan.h"

namespace tessera::ops::cuda {
namespace {

[[noreturn]] void cublaslt_failed(const char* call, cublasStatus_t status, const std::string& where) {
  throw runtime_error(std::string(call) + " failed with " + cublasLtGetStatusName(status) + " (" +
                          cublasLtGetStatusString(status) + ") for " + where,
                      "`tessera doctor --device cuda` runs a GEMM; CUDA_LAUNCH_BLOCKING=1 makes a failing kernel "
                      "report its own error");
}
#define TESSERA_CUBLASLT(where, fn, ...)                                           \
  do {                                                                             \
    const cublasStatus_t tessera_lt_status_ = fn(__VA_ARGS__);                     \
    if (tessera_lt_status_ != CUBLAS_STATUS_SUCCESS)                               \
      cublaslt_failed(#fn, tessera_lt_status_, (where));                           \
  } while (0)

constexpr size_t kWorkspaceBytes = size_t{32} << 20;  // what cuBLASLt's Hopper kernels ask for

// Owning wrappers of cuBLASLt's descriptors.
struct MatmulDesc {
  cublasLtMatmulDesc_t d = nullptr;
  ~MatmulDesc() { cublasLtMatmulDescDestroy(d); }
};
struct Layout {
  cublasLtMatrixLayout_t l = nullptr;
  ~Layout() { cublasLtMatrixLayoutDestroy(l); }
};
struct Preference {
  cublasLtMatmulPreference_t p = nullptr;
  ~Preference() { cublasLtMatmulPreferenceDestroy(p); }
};

// One planned GEMM (gemm_plan.h): everything cublasLtMatmul takes except the pointers.
struct GemmPlan {
  MatmulDesc op;
  Layout first, second, c;  // cuBLASLt's A (our B), B (our A), and C = D
  cublasLtMatmulHeuristicResult_t heuristic{};
};

// Per device: the cuBLASLt handle, its workspace and the plans (kept for the process). The
// lock covers planning and enqueueing: in-process ranks are threads sharing the device, and
// a plan's descriptor takes each call's bias pointer.
struct Lt {
  cublasLtHandle_t handle = nullptr;
  void* workspace = nullptr;
  PlanCache<GemmPlan> plans;
  std::mutex lock;
};

Lt& lt_of(Device& device) {
  static std::mutex lock;
  static auto* states = new std::map<const Device*, Lt>();  // leaked: see cuda_device.cpp
  std::lock_guard<std::mutex> guard(lock);
  Lt& lt = (*states)[&device];
  if (!lt.handle) {
    TESSERA_CUBLASLT(device.name(), cublasLtCreate, &lt.handle);
    lt.workspace = device.allocate(kWorkspaceBytes);
  }
  return lt;
}

template <typename T>
void set_attribute(const std::string& where, cublasLtMatmulDesc_t d, cublasLtMatmulDescAttributes_t a, const T& v) {
  TESSERA_CUBLASLT(where, cublasLtMatmulDescSetAttribute, d, a, &v, sizeof(v));
}
template <typename T>
void set_preference(const std::string& where, cublasLtMatmulPreference_t p, cublasLtMatmulPreferenceAttributes_t a,
                    const T& v) {
  TESSERA_CUBLASLT(where, cublasLtMatmulPreferenceSetAttribute, p, a, &v, sizeof(v));
}

// A matrix layout (column-major rows x cols, leading dimension ld) of a strided batch.
void make_layout(const std::string& where, Layout& layout, cudaDataType_t type, int64_t rows, int64_t cols,
                 int64_t ld, int64_t count, int64_t stride) {
  TESSERA_CUBLASLT(where, cublasLtMatrixLayoutCreate, &layout.l, type, rows, cols, ld);
  const auto count32 = static_cast<int32_t>(count);
  TESSERA_CUBLASLT(where, cublasLtMatrixLayoutSetAttribute, layout.l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count32,
                   sizeof(count32));
  TESSERA_CUBLASLT(where, cublasLtMatrixLayoutSetAttribute, layout.l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET,
                   &stride, sizeof(stride));
}

cublasLtEpilogue_t epilogue_of(const GemmKey& k) {
  if (k.gelu_aux) return k.bias ? CUBLASLT_EPILOGUE_GELU_AUX_BIAS : CUBLASLT_EPILOGUE_GELU_AUX;
  return k.bias ? CUBLASLT_EPILOGUE_BIAS : CUBLASLT_EPILOGUE_DEFAULT;
}

// The plan of the GEMM `k` describes (see gemm() for the column-major view).
std::unique_ptr<GemmPlan> make_plan(cublasLtHandle_t handle, const GemmKey& k, const std::string& where) {
  auto plan = std::make_unique<GemmPlan>();
  const auto compute = static_cast<cublasComputeType_t>(k.compute);
  TESSERA_CUBLASLT(where, cublasLtMatmulDescCreate, &plan->op.d, compute, CUDA_R_32F);
  set_attribute(where, plan->op.d, CUBLASLT_MATMUL_DESC_TRANSA, k.tb ? CUBLAS_OP_T : CUBLAS_OP_N);
  set_attribute(where, plan->op.d, CUBLASLT_MATMUL_DESC_TRANSB, k.ta ? CUBLAS_OP_T : CUBLAS_OP_N);
  set_attribute(where, plan->op.d, CUBLASLT_MATMUL_DESC_EPILOGUE, epilogue_of(k));
  if (k.gelu_aux) set_attribute(where, plan->op.d, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, k.ldc);
  // The first operand is B as stored: [K,N] row-major (N x K column-major), or [N,K] if tb.
  const auto ab = static_cast<cudaDataType_t>(k.ab);
  make_layout(where, plan->first, ab, k.tb ? k.K : k.N, k.tb ? k.N : k.K, k.ldb, k.batch, k.stride_b);
  make_layout(where, plan->second, ab, k.ta ? k.M : k.K, k.ta ? k.K : k.M, k.lda, k.batch, k.stride_a);
  make_layout(where, plan->c, static_cast<cudaDataType_t>(k.ct), k.N, k.M, k.ldc, k.batch, k.stride_c);
  Preference pref;
  TESSERA_CUBLASLT(where, cublasLtMatmulPreferenceCreate, &pref.p);
  set_preference(where, pref.p, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, uint64_t{kWorkspaceBytes});
  set_preference(where, pref.p, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, k.align_b);
  set_preference(where, pref.p, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, k.align_a);
  set_preference(where, pref.p, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, k.align_c);
  set_preference(where, pref.p, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, k.align_c);
  int found = 0;
  TESSERA_CUBLASLT(where, cublasLtMatmulAlgoGetHeuristic, handle, plan->op.d, plan->first.l, plan->second.l,
                   plan->c.l, plan->c.l, pref.p, 1, &plan->heuristic, &found);
  if (found == 0)
    throw runtime_error("cuBLASLt has no algorithm for " + where, "`tessera doctor --device cuda` runs a GEMM");
  return plan;
}

size_t type_size(cudaDataType_t t) { return t == CUDA_R_32F ? 4 : 2; }

}  // namespace

cudaDataType_t lt_type(DType t) {
  return t == DType::BF16 ? CUDA_R_16BF : t == DType::F16 ? CUDA_R_16F : CUDA_R_32F;
}

// cuBLASLt is column-major, so it computes C^T = op(B)^T @ op(A)^T: a row-major matrix is
// its transpose in column-major order, with the same leading dimension.
void gemm(Device& device, cudaDataType_t ab, bool ta, bool tb, int64_t M, int64_t N, int64_t K, const void* A,
          int64_t lda, const void* B, int64_t ldb, float beta, void* C, int64_t ldc, const void* bias,
          cudaDataType_t ct, const GemmBatch& batch, void* gelu_aux) {
  if (M == 0 || N == 0 || batch.count == 0) return;
  TESSERA_CHECK(batch.count <= INT32_MAX, "a batch of " + std::to_string(batch.count) + " GEMMs");
  TESSERA_CHECK(!gelu_aux || (batch.count == 1 && beta == 0.0f), "the GELU epilogue on a batch or an accumulation");
  const cublasComputeType_t compute =
      ab == CUDA_R_32F && device.tf32_matmul() ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
  const GemmKey key{.compute = compute,
                    .ab = ab,
                    .ct = ct,
                    .ta = ta,
                    .tb = tb,
                    .bias = bias != nullptr,
                    .M = M,
                    .N = N,
                    .K = K,
                    .lda = lda,
                    .ldb = ldb,
                    .ldc = ldc,
                    .align_a = batch_alignment(A, batch.stride_a * type_size(ab)),
                    .align_b = batch_alignment(B, batch.stride_b * type_size(ab)),
                    .align_c = batch_alignment(C, batch.stride_c * type_size(ct)),
                    .batch = batch.count,
                    .stride_a = batch.stride_a,
                    .stride_b = batch.stride_b,
                    .stride_c = batch.stride_c,
                    .gelu_aux = gelu_aux != nullptr};
  const std::string where = "a " + std::to_string(M) + "x" + std::to_string(N) + "x" + std::to_string(K) +
                            " GEMM" + (batch.count > 1 ? " (batch of " + std::to_string(batch.count) + ")" : "") +
                            " on " + device.name();
  Lt& lt = lt_of(device);
  std::lock_guard<std::mutex> guard(lt.lock);
  GemmPlan& plan = lt.plans.get(key, [&] { return make_plan(lt.handle, key, where); });
  if (bias) set_attribute(where, plan.op.d, CUBLASLT_MATMUL_DESC_BIAS_POINTER, bias);
  if (gelu_aux) set_attribute(where, plan.op.d, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, gelu_aux);
  const float alpha = 1.0f;
  TESSERA_CUBLASLT(where, cublasLtMatmul, lt.handle, plan.op.d, &alpha, B, plan.first.l, A, plan.second.l, &beta, C,
                   plan.c.l, C, plan.c.l, &plan.heuristic.algo, lt.workspace, kWorkspaceBytes,
                   tessera::cuda::stream_of(device));
}

void linear_gemm(const Tensor& out, const Tensor& inp, const Tensor& weight, const Tensor& bias,
                 const Tensor& gelu_aux) {
  const int64_t C = inp.dim(-1), N = inp.numel() / C, OC = weight.dim(0);
  gemm(*out.device, lt_type(inp.dtype), false, true, N, OC, C, memory(inp), C, memory(weight), C, 0.0f, memory(out),
       OC, memory(bias), lt_type(out.dtype), GemmBatch{}, memory(gelu_aux));
}

}  // namespace tessera::ops::cuda
