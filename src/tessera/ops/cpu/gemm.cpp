// The fast GEMMs: oneDNN's sgemm, and a oneDNN bf16 matmul for BF16 tensors. sgemm
// is row-major (unlike BLAS), takes 'N'/'T' per operand and runs on the OpenMP runtime,
// so it shares our kernels' thread pool and OMP_NUM_THREADS; so do the matmul primitives.
#include "tessera/ops/cpu/gemm.h"

#include <oneapi/dnnl/dnnl.h>

#include <atomic>
#include <cstring>
#include <map>
#include <oneapi/dnnl/dnnl.hpp>
#include <string>
#include <tuple>

#include "tessera/core/error.h"
#include "tessera/ops/cpu/low_precision.h"

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

// ---- bf16 -----------------------------------------------------------------------------
namespace {

dnnl::engine& cpu_engine() {
  static dnnl::engine engine(dnnl::engine::kind::cpu, 0);
  return engine;
}

using Bf16Key = std::tuple<bool, bool, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, float, float>;

// A oneDNN bf16 matmul for one shape, or none (creation failed or only the reference
// implementation exists: then sgemm on the expanded operands is far faster).
struct Bf16Primitive {
  bool ok = false;
  dnnl::matmul primitive;
  dnnl::matmul::primitive_desc pd;
  std::string impl;
};

Bf16Primitive make_bf16_primitive(const Bf16Key& key) {
  const auto [ta, tb, M, N, K, lda, ldb, ldc, alpha, beta] = key;
  using dt = dnnl::memory::data_type;
  const dnnl::memory::desc a({M, K}, dt::bf16, ta ? dnnl::memory::dims{1, lda} : dnnl::memory::dims{lda, 1});
  const dnnl::memory::desc b({K, N}, dt::bf16, tb ? dnnl::memory::dims{1, ldb} : dnnl::memory::dims{ldb, 1});
  const dnnl::memory::desc c({M, N}, dt::f32, dnnl::memory::dims{ldc, 1});
  Bf16Primitive p;
  try {
    dnnl::primitive_attr attr;
    if (alpha != 1.0f) attr.set_output_scales(0, {alpha});
    if (beta != 0.0f) {
      dnnl::post_ops ops;
      ops.append_sum(beta);
      attr.set_post_ops(ops);
    }
    p.pd = dnnl::matmul::primitive_desc(dnnl::matmul::desc(a, b, c), attr, cpu_engine());
    p.impl = p.pd.impl_info_str();
    if (p.impl.rfind("ref", 0) == 0) return p;
    p.primitive = dnnl::matmul(p.pd);
    p.ok = true;
  } catch (const dnnl::error&) {
    p.ok = false;
  }
  return p;
}

// Per calling thread: primitives are cached by shape; a stream per thread, as oneDNN
// recommends. A training step uses a handful of shapes; the cache is cleared if some
// caller sweeps through many.
struct Bf16Cache {
  std::map<Bf16Key, Bf16Primitive> primitives;
  dnnl::stream stream{cpu_engine()};
};
Bf16Cache& cache() {
  thread_local Bf16Cache instance;
  return instance;
}

struct Probe {
  bool available;
  std::string impl;
};
const Probe& probe() {
  static const Probe result = [] {
    const Bf16Primitive p = make_bf16_primitive(Bf16Key{false, true, 64, 64, 64, 64, 64, 64, 1.0f, 0.0f});
    return Probe{p.ok, p.ok ? p.impl : std::string("none")};
  }();
  return result;
}

std::atomic<bool> g_use_onednn{true};

}  // namespace

bool onednn_bf16_available() { return probe().available; }
const char* onednn_bf16_impl() { return probe().impl.c_str(); }
bool set_bf16_use_onednn(bool use) { return g_use_onednn.exchange(use); }
bool bf16_uses_onednn() { return g_use_onednn.load() && onednn_bf16_available(); }

void gemm_bf16(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const uint16_t* A,
               int64_t lda, const uint16_t* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  TESSERA_CHECK(M >= 0 && N >= 0 && K >= 0, "negative GEMM size");
  if (M == 0 || N == 0) return;
  if (K > 0 && onednn_bf16_available()) {
    Bf16Cache& c = cache();
    const Bf16Key key{trans_a, trans_b, M, N, K, lda, ldb, ldc, alpha, beta};
    auto it = c.primitives.find(key);
    if (it == c.primitives.end()) {
      if (c.primitives.size() >= 256) c.primitives.clear();
      it = c.primitives.emplace(key, make_bf16_primitive(key)).first;
    }
    const Bf16Primitive& p = it->second;
    if (p.ok) {
      dnnl::memory a(p.pd.src_desc(), cpu_engine(), const_cast<uint16_t*>(A));
      dnnl::memory b(p.pd.weights_desc(), cpu_engine(), const_cast<uint16_t*>(B));
      dnnl::memory d(p.pd.dst_desc(), cpu_engine(), C);
      try {
        p.primitive.execute(c.stream, {{DNNL_ARG_SRC, a}, {DNNL_ARG_WEIGHTS, b}, {DNNL_ARG_DST, d}});
        c.stream.wait();
      } catch (const dnnl::error& e) {
        TESSERA_CHECK(false, std::string("oneDNN bf16 matmul failed: ") + e.what());
      }
      return;
    }
  }
  // No oneDNN kernel for this shape: expand the operands to f32 (exact) as stored and
  // multiply with sgemm.
  const int64_t a_rows = trans_a ? K : M, a_cols = trans_a ? M : K;
  const int64_t b_rows = trans_b ? N : K, b_cols = trans_b ? K : N;
  float* a32 = static_cast<float*>(workspace(Workspace::ExpandA, static_cast<size_t>(a_rows * a_cols) * 4));
  float* b32 = static_cast<float*>(workspace(Workspace::ExpandB, static_cast<size_t>(b_rows * b_cols) * 4));
  expand_bf16(a32, A, a_rows, a_cols, lda);
  expand_bf16(b32, B, b_rows, b_cols, ldb);
  sgemm(trans_a, trans_b, M, N, K, alpha, a32, a_cols, b32, b_cols, beta, C, ldc);
}

}  // namespace tessera::ops::cpu
