// Linear layer on CUDA: the GEMMs through cuBLASLt, the bias and its gradient through
// ops/kernels/elementwise.cl. Shapes and the dtype contract as ops/cpu/linear.cpp:
//   forward:  out[N,OC]  = inp[N,C] @ W[OC,C]^T + bias[OC]
//   backward: dinp[N,C] += dout @ W;  dW[OC,C] += dout^T @ inp;  dbias[OC] += column sums
// All-F32 calls multiply f32 operands with f32 accumulation (CUBLAS_COMPUTE_32F: exact
// f32), or with TF32 operands when the device allows it (--tf32, device.h's
// set_tf32_matmul); the forward adds the bias in cuBLASLt's epilogue. Each distinct GEMM
// is planned once (gemm_plan.h).
//
// 16-bit tensors (ops.h: any of inp, weight, bias, out, dinp, dout, dweight, dbias may be
// BF16 or F16): cuBLASLt multiplies bf16 or f16 operands natively
// (32F compute) when a GEMM's operands share their dtype, else every operand is widened
// into f32 scratch first (exact). C/D take the output's dtype, so cuBLASLt rounds each
// result once, after the f32 accumulation (and the epilogue's bias) and, for a gradient,
// after adding the old value (beta = 1); where cuBLASLt has no such type combination
// (f32 operands with a 16-bit output, a bias of another dtype than out) the GEMM lands in
// f32 scratch and a kernel adds and rounds once.
#include <cublasLt.h>

#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "tessera/device/cuda/cuda_stream.h"
#include "tessera/ops/cuda/cuda_launch.h"
#include "tessera/ops/cuda/cuda_ops.h"
#include "tessera/ops/cuda/gemm_plan.h"
#include "tessera/ops/kernels/float_args.h"

#define TESSERA_BACKEND cuda
#include "tessera/ops/kernels/linear_host.inc"
#undef TESSERA_BACKEND

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

// The plan of the GEMM `k` describes (see gemm() for the column-major view).
std::unique_ptr<GemmPlan> make_plan(cublasLtHandle_t handle, const GemmKey& k, const std::string& where) {
  auto plan = std::make_unique<GemmPlan>();
  const auto compute = static_cast<cublasComputeType_t>(k.compute);
  TESSERA_CUBLASLT(where, cublasLtMatmulDescCreate, &plan->op.d, compute, CUDA_R_32F);
  set_attribute(where, plan->op.d, CUBLASLT_MATMUL_DESC_TRANSA, k.tb ? CUBLAS_OP_T : CUBLAS_OP_N);
  set_attribute(where, plan->op.d, CUBLASLT_MATMUL_DESC_TRANSB, k.ta ? CUBLAS_OP_T : CUBLAS_OP_N);
  if (k.bias) set_attribute(where, plan->op.d, CUBLASLT_MATMUL_DESC_EPILOGUE, CUBLASLT_EPILOGUE_BIAS);
  // The first operand is B as stored: [K,N] row-major (N x K column-major), or [N,K] if tb.
  const auto ab = static_cast<cudaDataType_t>(k.ab);
  TESSERA_CUBLASLT(where, cublasLtMatrixLayoutCreate, &plan->first.l, ab, k.tb ? k.K : k.N, k.tb ? k.N : k.K, k.ldb);
  TESSERA_CUBLASLT(where, cublasLtMatrixLayoutCreate, &plan->second.l, ab, k.ta ? k.M : k.K, k.ta ? k.K : k.M, k.lda);
  TESSERA_CUBLASLT(where, cublasLtMatrixLayoutCreate, &plan->c.l, static_cast<cudaDataType_t>(k.ct), k.N, k.M, k.ldc);
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

// Row-major C[M,N] (of type ct, leading dimension ldc) = op(A)[M,K] @ op(B)[K,N] + beta * C
// (+ bias[N] of C's type when given), A and B of type ab (leading dimensions lda, ldb as
// stored). f32 operands multiply exactly unless the device allows TF32 (--tf32).
// cuBLASLt is column-major, so it computes C^T = op(B)^T @ op(A)^T: a row-major matrix is
// its transpose in column-major order, with the same leading dimension.
void gemm(Device& device, cudaDataType_t ab, bool ta, bool tb, int64_t M, int64_t N, int64_t K, const void* A,
          int64_t lda, const void* B, int64_t ldb, float beta, void* C, int64_t ldc, const void* bias = nullptr,
          cudaDataType_t ct = CUDA_R_32F) {
  if (M == 0 || N == 0) return;
  const cublasComputeType_t compute =
      ab == CUDA_R_32F && device.tf32_matmul() ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
  const GemmKey key{compute,     ab,  ct,  ta,  tb,  bias != nullptr, M, N, K, lda, ldb, ldc, alignment_of(A),
                    alignment_of(B), alignment_of(C)};
  const std::string where = "a " + std::to_string(M) + "x" + std::to_string(N) + "x" + std::to_string(K) +
                            " GEMM on " + device.name();
  Lt& lt = lt_of(device);
  std::lock_guard<std::mutex> guard(lt.lock);
  GemmPlan& plan = lt.plans.get(key, [&] { return make_plan(lt.handle, key, where); });
  if (bias) set_attribute(where, plan.op.d, CUBLASLT_MATMUL_DESC_BIAS_POINTER, bias);
  const float alpha = 1.0f;
  TESSERA_CUBLASLT(where, cublasLtMatmul, lt.handle, plan.op.d, &alpha, B, plan.first.l, A, plan.second.l, &beta, C,
                   plan.c.l, C, plan.c.l, &plan.heuristic.algo, lt.workspace, kWorkspaceBytes,
                   tessera::cuda::stream_of(device));
}

float* f32(const Tensor& t) { return t.empty() ? nullptr : static_cast<float*>(t.handle) + element_offset(t); }

// One op's 16-bit operands and f32 temporaries, carved out of the device's scratch.
class Pieces {
 public:
  Pieces(Device& device, std::initializer_list<size_t> bytes) : offsets_(offsets(bytes)), lease_(device, offsets_.back()) {}
  void* operator[](size_t i) const { return static_cast<char*>(lease_.data()) + offsets_[i]; }

 private:
  // Where each piece starts (256-byte aligned, as cuBLASLt likes), then the total.
  static std::vector<size_t> offsets(std::initializer_list<size_t> bytes) {
    std::vector<size_t> r{0};
    for (size_t b : bytes) r.push_back(r.back() + (b + 255) / 256 * 256);
    return r;
  }
  std::vector<size_t> offsets_;
  ScratchLease lease_;
};

cudaDataType_t lt_type(DType t) {
  return t == DType::BF16 ? CUDA_R_16BF : t == DType::F16 ? CUDA_R_16F : CUDA_R_32F;
}
void* memory(const Tensor& t) { return t.empty() ? nullptr : static_cast<char*>(t.handle) + t.offset; }
Tensor f32_at(void* p, int64_t rows, int64_t cols, const Tensor& like) {
  return Tensor(p, 0, DType::F32, {rows, cols}, like.device);
}

// t (rows x cols, contiguous) as the f32 operand in `dst` when `widen`, else in place.
const void* operand(void* dst, const Tensor& t, int64_t rows, int64_t cols, bool widen) {
  if (!widen || t.dtype == DType::F32) return memory(t);
  rows_plus_bias(f32_at(dst, rows, cols, t), cols, t, cols, Tensor(), rows, cols);
  return dst;
}

// dst[M,N] += op(A) @ op(B) (A, B of type ab), rounded once into dst: by cuBLASLt directly
// when it takes dst's type with these operands, else through the f32 scratch `tmp`.
void accumulate_gemm(const Tensor& dst, void* tmp, cudaDataType_t ab, bool ta, bool tb, int64_t M, int64_t N,
                     int64_t K, const void* A, int64_t lda, const void* B, int64_t ldb) {
  Device& device = *dst.device;
  if (ab != CUDA_R_32F || dst.dtype == DType::F32)
    return gemm(device, ab, ta, tb, M, N, K, A, lda, B, ldb, 1.0f, memory(dst), N, nullptr, lt_type(dst.dtype));
  const Tensor acc = f32_at(tmp, M, N, dst);
  rows_plus_bias(acc, N, dst, N, Tensor(), M, N);
  gemm(device, ab, ta, tb, M, N, K, A, lda, B, ldb, 1.0f, tmp, N);
  rows_plus_bias(dst, N, acc, N, Tensor(), M, N);
}

void forward_16bit(const Tensor& out, const Tensor& inp, const Tensor& weight, const Tensor& bias, int64_t N,
                   int64_t C, int64_t OC) {
  const bool widen = inp.dtype != weight.dtype;
  const cudaDataType_t ab = widen ? CUDA_R_32F : lt_type(inp.dtype);
  const bool direct = (ab != CUDA_R_32F || out.dtype == DType::F32) && (bias.empty() || bias.dtype == out.dtype);
  const Pieces scratch(*out.device, {widen ? size_t(N * C) * 4 : 0, widen ? size_t(OC * C) * 4 : 0,
                                     direct ? 0 : size_t(N * OC) * 4});
  const void* x = operand(scratch[0], inp, N, C, widen);
  const void* w = operand(scratch[1], weight, OC, C, widen);
  if (direct)
    return gemm(*out.device, ab, false, true, N, OC, C, x, C, w, C, 0.0f, memory(out), OC, memory(bias),
                lt_type(out.dtype));
  gemm(*out.device, ab, false, true, N, OC, C, x, C, w, C, 0.0f, scratch[2], OC);
  rows_plus_bias(out, OC, f32_at(scratch[2], N, OC, out), OC, bias, N, OC);
}

void backward_16bit(const Tensor& dinp, const Tensor& dweight, const Tensor& dout, const Tensor& inp,
                    const Tensor& weight, int64_t N, int64_t C, int64_t OC) {
  const bool widen = dout.dtype != weight.dtype || dout.dtype != inp.dtype;
  const cudaDataType_t ab = widen ? CUDA_R_32F : lt_type(dout.dtype);
  auto via_scratch = [&](const Tensor& d) { return !d.empty() && ab == CUDA_R_32F && d.dtype != DType::F32; };
  const Pieces scratch(*dout.device, {widen ? size_t(N * OC) * 4 : 0, widen && !dinp.empty() ? size_t(OC * C) * 4 : 0,
                                      widen && !dweight.empty() ? size_t(N * C) * 4 : 0,
                                      via_scratch(dinp) ? size_t(N * C) * 4 : 0,
                                      via_scratch(dweight) ? size_t(OC * C) * 4 : 0});
  const void* g = operand(scratch[0], dout, N, OC, widen);
  if (!dinp.empty())
    accumulate_gemm(dinp, scratch[3], ab, false, false, N, C, OC, g, OC, operand(scratch[1], weight, OC, C, widen), C);
  if (!dweight.empty())
    accumulate_gemm(dweight, scratch[4], ab, true, false, OC, C, N, g, OC, operand(scratch[2], inp, N, C, widen), C);
}

void check_forward(const Tensor& out, const Tensor& inp, const Tensor& weight, const Tensor& bias) {
  const int64_t C = inp.dim(-1), N = inp.numel() / C, OC = weight.dim(0);
  TESSERA_CHECK(weight.ndim() == 2 && weight.dim(1) == C && out.numel() == N * OC && out.dim(-1) == OC &&
                    (bias.empty() || bias.numel() == OC),
                "linear: inp " + shape_str(inp.shape) + ", weight " + shape_str(weight.shape) + ", out " +
                    shape_str(out.shape));
}

void check_backward(const Tensor& dinp, const Tensor& dweight, const Tensor& dbias, const Tensor& dout,
                    const Tensor& inp, const Tensor& weight) {
  const int64_t C = inp.dim(-1), N = inp.numel() / C, OC = weight.dim(0);
  TESSERA_CHECK(weight.ndim() == 2 && weight.dim(1) == C && dout.numel() == N * OC && dout.dim(-1) == OC,
                "linear backward: dout " + shape_str(dout.shape) + ", inp " + shape_str(inp.shape) + ", weight " +
                    shape_str(weight.shape));
  TESSERA_CHECK((dinp.empty() || dinp.numel() == N * C) && (dweight.empty() || dweight.numel() == OC * C) &&
                    (dbias.empty() || dbias.numel() == OC),
                "linear backward: gradient shapes");
}

}  // namespace

void linear_forward(Tensor out, Tensor inp, Tensor weight, Tensor bias) {
  check_forward(out, inp, weight, bias);
  check_floating("linear_forward", {{"out", out}, {"inp", inp}, {"weight", weight}, {"bias", bias}});
  const int64_t C = inp.dim(-1), N = inp.numel() / C, OC = weight.dim(0);
  if (!all_f32({&out, &inp, &weight, &bias})) {
    if (C == 0) return bias.empty() ? fill_zero(out) : rows_plus_bias(out, OC, bias, 0, Tensor(), N, OC);
    return forward_16bit(out, inp, weight, bias, N, C, OC);
  }
  if (C == 0) {  // an empty product: out is the bias, or zeros
    if (bias.empty()) return fill_zero(out);
    CudaLaunch(out, "broadcast_bias").floats(out).floats(bias).scalar<int64_t>(OC).run(OC, N);
    return;
  }
  gemm(*out.device, CUDA_R_32F, false, true, N, OC, C, f32(inp), C, f32(weight), C, 0.0f, f32(out), OC, f32(bias));
}

void linear_backward(Tensor dinp, Tensor dweight, Tensor dbias, Tensor dout, Tensor inp, Tensor weight) {
  check_backward(dinp, dweight, dbias, dout, inp, weight);
  check_floating("linear_backward", {{"dinp", dinp}, {"dweight", dweight}, {"dbias", dbias}, {"dout", dout},
                                     {"inp", inp}, {"weight", weight}});
  const int64_t C = inp.dim(-1), N = inp.numel() / C, OC = weight.dim(0);
  Device& device = *dout.device;
  if (!dbias.empty()) column_sums(dbias, dout);
  if (!all_f32({&dinp, &dweight, &dbias, &dout, &inp, &weight}))
    return backward_16bit(dinp, dweight, dout, inp, weight, N, C, OC);
  if (!dinp.empty()) gemm(device, CUDA_R_32F, false, false, N, C, OC, f32(dout), OC, f32(weight), C, 1.0f, f32(dinp), C);
  if (!dweight.empty())
    gemm(device, CUDA_R_32F, true, false, OC, C, N, f32(dout), OC, f32(inp), C, 1.0f, f32(dweight), C);
}

}  // namespace tessera::ops::cuda
