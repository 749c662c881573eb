// Linear layer on Megatron's [out, in] weight layout, all GEMMs through oneDNN (gemm.h).
// Legend: N rows (= B*T, leading dims flattened), C input channels, OC output channels.
//   forward:  out[N,OC]   = inp[N,C] @ W[OC,C]^T + bias[OC]
//   backward: dinp[N,C]  += dout[N,OC] @ W[OC,C]     (= with GradWrite::Assign: beta = 0)
//             dW[OC,C]   += dout[N,OC]^T @ inp[N,C]  (= with param_write Assign: beta = 0)
//             dbias[OC]  += column sums of dout     (= with param_write Assign)
// The accumulating GEMMs use beta = 1, so gradient accumulation costs nothing extra.
// bias_add_forward / bias_add_backward are the bias alone, for row-parallel linears that
// add it after the tensor-parallel reduction.
//
// The GEMMs follow the tensors' dtypes (ops.h): all-F32 calls multiply with sgemm on the
// tensors' own memory. A call with any BF16/F16 tensor goes through linear_*_storage:
// bf16 operands through oneDNN's bf16 matmul where this CPU has one, else operands
// widened to f32 for sgemm; results of 16-bit tensors computed in f32 and rounded once.
// There the weight-row dimension OC is processed in tiles (lowp_tile_elements) so a
// 50k-row LM head does not need a widened copy of the whole weight, logits or their
// gradient; a backward that widens nothing (bf16 bits, f32 weight gradient) runs whole.
// Data gradients of bf16 bits with a long K (the sum dimension) go in K tiles that keep their
// share of the weight in L2 (gemm_bf16_in_k_tiles), and weight gradients and long-K forward
// products of bf16 bits go through tessera's AMX kernels (amx_gemm.h) where they fit, except
// in --deterministic-mode.
#include <algorithm>
#include <initializer_list>
#include <optional>
#include <string>
#include <utility>

#include "tessera/device/device.h"
#include "tessera/ops/cpu/amx_gemm.h"
#include "tessera/ops/cpu/cpu_ops.h"
#include "tessera/ops/cpu/gemm.h"
#include "tessera/ops/cpu/low_precision.h"
#include "tessera/ops/cpu/storage.h"
#include "tessera/ops/linear_shapes.h"

namespace tessera::ops::cpu {
namespace {

// Column sums of dy[N,OC] (any float dtype): threads own column blocks and walk the rows
// in order (deterministic for any thread count, vectorised along the row, rows staged in
// groups); finish(o, sum) is called once per column.
template <typename Finish>
void column_sums(const Tensor& dy, int64_t N, int64_t OC, Finish finish) {
  constexpr int64_t kBlock = 256, kRows = 64;
  const int64_t blocks = (OC + kBlock - 1) / kBlock;
#pragma omp parallel for schedule(static)
  for (int64_t blk = 0; blk < blocks; ++blk) {
    const int64_t o0 = blk * kBlock, len = std::min(kBlock, OC - o0);
    float acc[kBlock] = {};
    for (int64_t n0 = 0; n0 < N; n0 += kRows) {
      Stage s;
      const int64_t rows = std::min(kRows, N - n0);
      const Block b = s.in(dy, n0 * OC + o0, rows, len, OC);
      for (int64_t r = 0; r < rows; ++r) {
        const float* row = b.row(r);
#pragma omp simd
        for (int64_t o = 0; o < len; ++o) acc[o] += row[o];
      }
    }
    for (int64_t o = 0; o < len; ++o) finish(o0 + o, acc[o]);
  }
}

// dbias[OC] (+)= the column sums of dout[N,OC] per `write` (zeros when N == 0).
void column_sums_into(const Tensor& dbias, const Tensor& dout, GradWrite write) {
  const int64_t OC = dbias.numel();
  TESSERA_CHECK(OC > 0 && dout.ndim() >= 1 && dout.dim(-1) == OC,
                "bias_add backward: dbias " + shape_str(dbias.shape) + ", dout " + shape_str(dout.shape));
  check_float(dbias, "bias_add_backward", "dbias");
  check_float(dout, "bias_add_backward", "dout");
  const int64_t N = dout.numel() / OC;
  Stage grads(Stage::Caller);
  float* db = grads.grad(dbias, 0, OC, write);
  column_sums(dout, N, OC, [db](int64_t o, float sum) { db[o] += sum; });
  grads.done(dbias, 0, OC, db);
}

// Weight rows per tile: the largest converted block (tile x C weight rows, N x tile dout
// columns) stays within lowp_tile_elements; at least 64 rows, a multiple of 64.
int64_t tile_rows(int64_t OC, int64_t C, int64_t N) {
  const int64_t rows = std::max<int64_t>(64, lowp_tile_elements() / std::max<int64_t>({C, N, 1}) / 64 * 64);
  return std::max<int64_t>(1, std::min(OC, rows));
}

// ---- 16-bit storage ---------------------------------------------------------------------
// A call with any BF16/F16 tensor (ops.h: products in f32 of exactly widened operands, each
// result rounded once). bf16 operands go straight into oneDNN's bf16 matmul where this CPU
// has one (no conversion); otherwise every operand that is not F32 is widened into an f32
// workspace and multiplied with sgemm: the same products, summed in f32. A result of a
// 16-bit tensor is computed in an f32 workspace and rounded into it once.

// C[M,N] = A[M,K] @ B[K,N] + beta * C on bf16 bits (both row-major, leading dimensions lda, ldb) in K
// tiles of `tile`, each tile's A columns copied contiguous first (a strided A tile sends
// oneDNN to gemm:jit, without AMX), the tiles' products added in order onto C. oneDNN's
// brgemm walks the whole K for each block of C's rows, so with a long K it streams B from
// memory once per block; a B tile serves every block while it is in L2.
void gemm_bf16_in_k_tiles(int64_t M, int64_t N, int64_t K, int64_t tile, const uint16_t* A, int64_t lda,
                          const uint16_t* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  uint16_t* packed =
      static_cast<uint16_t*>(workspace(Workspace::Dout, static_cast<size_t>(M * std::min(tile, K)) * 2));
  for (int64_t k0 = 0; k0 < K; k0 += tile) {
    const int64_t len = std::min(tile, K - k0);
#pragma omp parallel for schedule(static)
    for (int64_t m = 0; m < M; ++m) std::copy(A + m * lda + k0, A + m * lda + k0 + len, packed + m * len);
    gemm_bf16(false, false, M, N, len, 1.0f, packed, len, B + k0 * ldb, ldb, k0 == 0 ? beta : 1.0f, C, ldc);
  }
}

// The LM head's data gradient dx[N,C] = dout[N,V] @ W[V,C] (K = the vocabulary) goes in K
// tiles of kPackedK: a tile of W (1.5 MB) stays in L2 while every block of rows uses it.
// Measured alone (bench/bf16_gemm_bench): 560-580 GFLOP/s against 280-330 whole and 440-500
// in strided tiles. It runs so in every mode (it did before --deterministic-mode existed).
constexpr int64_t kPackedK = 1024;

// Data gradients dx = dout @ W on bf16 bits with K > kMaxKTile (the MLP's fc1, K = 3072 in
// GPT-2 124M; attention's qkv, K = 2304) go in even K tiles of at most kMaxKTile, outside
// --deterministic-mode (the tiles sum in another order). At M = 256 rows and 2 threads,
// the critical path (the busier thread's CPU time) ran 20-29 % faster for fc1's dx than one
// whole-K call, with dout cold (bench/bf16_gemm_bench) or just written (as in the step), both
// threads busier (1.93-1.95 of 2 against 1.82-1.90); qkv's gained 15-20 % cold, less with a
// hot dout; an uneven tail tile (1152 + 1152 + 768 for K = 3072) lost the gain. Forward
// products (B = W^T; fc2's K = 3072) gained 16 % cold but nothing with the input just
// written, as it is in the step, so they stay whole.
constexpr int64_t kMaxKTile = 1536;
int64_t even_k_tile(int64_t K) {
  const int64_t tiles = (K + kMaxKTile - 1) / kMaxKTile;
  return ((K + tiles - 1) / tiles + 63) / 64 * 64;
}

// Forward products of bf16 bits with a long K (C >= kAmxForwardK: GPT-2's fc2, K = 3072) go
// through the AMX kernel (amx_gemm.h) outside --deterministic-mode: 461 -> 708 GFLOP per
// CPU-second with the operands cold (bench/bf16_gemm_bench 4 12 amx, N = 256, 2-core Sapphire
// Rapids); in the --bf16 step (GPT-2 124M, T = 64: 12 such calls of 37) linear_forward's CPU
// time fell ~5 % (85 -> 82 and 82.5 -> 78 ms, medians of 3 runs). With K = 768 the kernel was
// not reliably faster than oneDNN 2.6's brgemm (qkv 548 -> 584, proj 634 -> 426, fc1 498 -> 526,
// LM head 568 -> 584), so those stay.
constexpr int64_t kAmxForwardK = 2048;

// A GEMM operand: bfloat16 bits (oneDNN path) or f32 values, with its leading dimension.
struct Operand {
  const void* p;
  int64_t ld;
};

struct Storage {
  bool bits;       // every GEMM operand bf16 and oneDNN has a bf16 kernel: multiply the bits directly
  bool any_order;  // bits may be summed in another order than one oneDNN call's (a long K in tiles, the
                   // AMX weight gradient): not in --deterministic-mode

  // The rows x cols block at element off of t (leading dimension ld) as an operand: t's own
  // memory when it is bf16 bits for oneDNN or f32, else widened into `slot`.
  Operand operand(const Tensor& t, int64_t off, int64_t rows, int64_t cols, int64_t ld, Workspace slot) const {
    if (bits || t.dtype == DType::F32) return {cpu_memory(t) + off * static_cast<int64_t>(dtype_size(t.dtype)), ld};
    float* w = static_cast<float*>(workspace(slot, static_cast<size_t>(rows * cols) * sizeof(float)));
    widen_parallel(w, t, off, rows, cols, ld);
    return {w, cols};
  }
  // C = op(A) @ op(B) + beta * C.
  void gemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, Operand A, Operand B, float beta, float* C,
            int64_t ldc) const {
    if (bits && any_order && !ta && !tb && K > kMaxKTile)
      gemm_bf16_in_k_tiles(M, N, K, even_k_tile(K), static_cast<const uint16_t*>(A.p), A.ld,
                           static_cast<const uint16_t*>(B.p), B.ld, beta, C, ldc);
    else if (bits)
      gemm_bf16(ta, tb, M, N, K, 1.0f, static_cast<const uint16_t*>(A.p), A.ld, static_cast<const uint16_t*>(B.p),
                B.ld, beta, C, ldc);
    else
      sgemm(ta, tb, M, N, K, 1.0f, static_cast<const float*>(A.p), A.ld, static_cast<const float*>(B.p), B.ld, beta,
            C, ldc);
  }
  // y[N,OC] = x @ w^T + beta * y, x = inp[N,C] and w = W[OC,C] contiguous.
  void forward(int64_t N, int64_t OC, int64_t C, Operand x, Operand w, float beta, float* y, int64_t ldy) const {
    if (bits && any_order && C >= kAmxForwardK && x.ld == C && w.ld == C && amx_linear_fits(N, C, OC))
      return amx_linear_forward(y, ldy, static_cast<const uint16_t*>(x.p), static_cast<const uint16_t*>(w.p), N, C,
                                OC, beta != 0.0f);
    gemm(false, true, N, OC, C, x, w, beta, y, ldy);
  }
  // dW[OC,C] = g^T @ x + beta * dW, g = dout[N,OC] and x = inp[N,C] (contiguous), dW f32 (leading
  // dimension C).
  // Bits go through the AMX kernel where it fits (it loads dW's own f32 tiles to accumulate, or
  // starts from zero tiles to assign):
  // GFLOP per CPU-second, operands cold, N = 256, oneDNN -> AMX (bench/bf16_gemm_bench 4 12 amx,
  // 2-core Sapphire Rapids): qkv 379 -> 499, proj 383 -> 383, fc1 418 -> 498, fc2 379 -> 457,
  // LM head 460 -> 596; in the --bf16 step (GPT-2 124M, T = 64) linear_backward's CPU time fell
  // 201 -> 161 ms and linear_bias_gelu_backward's 69 -> 55 (medians of 3 runs). (An AMX data
  // gradient was slower than oneDNN in K tiles; the forward gained only with a long K: kAmxForwardK.)
  // With squares (dW's own f32 memory), the AMX kernel adds dW's sum of squares to *squares
  // and this returns true; otherwise false, and the caller reads dW for them.
  bool weight_gradient(int64_t OC, int64_t C, int64_t N, Operand g, Operand x, float beta, float* dw,
                       double* squares) const {
    if (bits && any_order && g.ld % 2 == 0 && x.ld == C && amx_linear_fits(N, C, OC)) {
      amx_linear_dweight(dw, static_cast<const uint16_t*>(g.p), g.ld, static_cast<const uint16_t*>(x.p), N, C, OC,
                         beta != 0.0f, squares);
      return squares != nullptr;
    }
    gemm(true, false, OC, C, N, g, x, beta, dw, C);
    return false;
  }
};

bool all_bf16(std::initializer_list<const Tensor*> tensors) {
  for (const Tensor* t : tensors)
    if (t->dtype != DType::BF16) return false;
  return bf16_uses_onednn();
}

// An f32 accumulator for rows x cols elements at element off of t (leading dimension
// ld): t's own memory when F32, else a workspace holding its widened values, which
// finish() rounds back once.
struct Accumulator {
  const Tensor& t;
  int64_t off, rows, cols, ld;
  Block b;
  Accumulator(const Tensor& t_, int64_t off_, int64_t rows_, int64_t cols_, int64_t ld_, Workspace slot, bool load)
      : t(t_), off(off_), rows(rows_), cols(cols_), ld(ld_) {
    if (t.dtype == DType::F32) {
      b = {reinterpret_cast<float*>(cpu_memory(t)) + off, ld};
      return;
    }
    b = {static_cast<float*>(workspace(slot, static_cast<size_t>(rows * cols) * sizeof(float))), cols};
    if (load) widen_parallel(b.p, t, off, rows, cols, ld);
  }
  void finish() const {
    if (t.dtype != DType::F32) narrow_parallel(t, off, ld, b.p, b.ld, rows, cols);
  }
};

void linear_forward_storage(Tensor out, Tensor inp, Tensor weight, Tensor bias) {
  const int64_t C = inp.dim(-1), N = inp.numel() / C, OC = weight.dim(0);
  if (N == 0 || OC == 0) return;
  const Storage st{all_bf16({&inp, &weight}), !deterministic_mode(inp)};
  const int64_t tile = tile_rows(OC, C, N);
  const Operand x = st.operand(inp, 0, N, C, C, Workspace::Input);
  float* b = nullptr;
  if (!bias.empty()) {
    b = static_cast<float*>(workspace(Workspace::Small, static_cast<size_t>(OC) * sizeof(float)));
    widen(b, bias, 0, 1, OC, OC);
  }
  for (int64_t o0 = 0; o0 < OC; o0 += tile) {
    const int64_t len = std::min(tile, OC - o0);
    const Operand w = st.operand(weight, o0 * C, len, C, C, Workspace::Weight);
    const Accumulator y(out, o0, N, len, OC, Workspace::Out, false);
    // The bias is broadcast into the result and the GEMM adds onto it (beta = 1).
    if (b) {
#pragma omp parallel for schedule(static)
      for (int64_t n = 0; n < N; ++n) std::copy(b + o0, b + o0 + len, y.b.row(n));
    }
    st.forward(N, len, C, x, w, b ? 1.0f : 0.0f, y.b.p, y.b.ld);
    y.finish();
  }
}

// Returns whether it added dweight's squares to `squares` (else the caller sums them).
bool linear_backward_storage(Tensor dinp, Tensor dweight, Tensor dbias, Tensor dout, Tensor inp, Tensor weight,
                             GradWrite write, GradWrite param_write, double* squares) {
  const int64_t C = inp.dim(-1), N = inp.numel() / C, OC = weight.dim(0);
  if (!dbias.empty()) column_sums_into(dbias, dout, param_write);
  if ((dinp.empty() && dweight.empty()) || OC == 0 || N == 0) return false;
  const bool assign = write == GradWrite::Assign, assign_dw = param_write == GradWrite::Assign;
  const Storage st{all_bf16({&dout, &inp, &weight}), !deterministic_mode(inp)};
  // Tiles bound the widened copies; multiplying bits into an f32 weight gradient widens
  // nothing, so one tile: the LM head's dout is then contiguous, not a strided column block.
  const bool whole = st.bits && (dweight.empty() || dweight.dtype == DType::F32);
  const int64_t tile = whole ? OC : tile_rows(OC, C, N);
  const Operand x = dweight.empty() ? Operand{} : st.operand(inp, 0, N, C, C, Workspace::Input);
  // dinp collects every tile's dout @ W in f32 (the first tile's GEMM overwrites it when
  // assigning) and is rounded once at the end.
  const std::optional<Accumulator> dx =
      dinp.empty() ? std::nullopt
                   : std::optional<Accumulator>(std::in_place, dinp, 0, N, C, C, Workspace::Out, !assign);
  // The kernel squares dW only where dW is its own f32 memory, in one tile.
  double* fused_squares = dweight.dtype == DType::F32 && tile == OC ? squares : nullptr;
  bool squared = false;
  for (int64_t o0 = 0; o0 < OC; o0 += tile) {
    const int64_t len = std::min(tile, OC - o0);
    const Operand g = st.operand(dout, o0, N, len, OC, Workspace::Dout);  // dout[:, o0:o0+len]
    if (dx && whole && OC > 4 * kPackedK) {
      gemm_bf16_in_k_tiles(N, C, OC, kPackedK, static_cast<const uint16_t*>(g.p), g.ld,
                           reinterpret_cast<const uint16_t*>(cpu_memory(weight)), C, assign ? 0.0f : 1.0f, dx->b.p,
                           dx->b.ld);
    } else if (dx) {
      const Operand w = st.operand(weight, o0 * C, len, C, C, Workspace::Weight);
      st.gemm(false, false, N, C, len, g, w, assign && o0 == 0 ? 0.0f : 1.0f, dx->b.p, dx->b.ld);
    }
    if (!dweight.empty()) {
      const Accumulator dw(dweight, o0 * C, len, C, C, Workspace::Small, !assign_dw);
      squared = st.weight_gradient(len, C, N, g, x, assign_dw ? 0.0f : 1.0f, dw.b.p, fused_squares);
      dw.finish();
    }
  }
  if (dx) dx->finish();
  return squared;
}

// The dtypes of a linear call must be floats. Returns whether any tensor is 16-bit.
bool check_dtypes(const char* op, std::initializer_list<std::pair<const Tensor*, const char*>> args) {
  bool lowp = false;
  for (auto [t, name] : args) {
    check_float(*t, op, name);
    lowp |= !t->empty() && t->dtype != DType::F32;
  }
  return lowp;
}

}  // namespace

void linear_forward(Tensor out, Tensor inp, Tensor weight, Tensor bias) {
  check_linear_forward_shapes(out, inp, weight, bias);
  if (check_dtypes("linear_forward", {{&out, "out"}, {&inp, "inp"}, {&weight, "weight"}, {&bias, "bias"}}))
    return linear_forward_storage(out, inp, weight, bias);
  const int64_t C = inp.dim(-1), N = inp.numel() / C, OC = weight.dim(0);
  float* y = f32(out);
  float beta = 0.0f;
  if (!bias.empty()) {
    // Broadcast the bias into out and let the GEMM add onto it (beta = 1): one pass over
    // out instead of a GEMM pass plus a bias pass.
    const float* b = f32(bias);
#pragma omp parallel for schedule(static)
    for (int64_t n = 0; n < N; ++n) std::copy(b, b + OC, y + n * OC);
    beta = 1.0f;
  }
  sgemm(false, true, N, OC, C, 1.0f, f32(inp), C, f32(weight), C, beta, y, OC);
}

void linear_backward(Tensor dinp, Tensor dweight, Tensor dbias, Tensor dout, Tensor inp, Tensor weight,
                     GradWrite write, GradWrite param_write, GradSquares dweight_squares) {
  check_linear_backward_shapes(dinp, dweight, dbias, dout, inp, weight);
  const bool squares = !dweight_squares.sums.empty();
  TESSERA_CHECK(!squares || (!dweight.empty() && dweight_squares.slot >= 0 &&
                             dweight_squares.slot < dweight_squares.sums.numel()),
                "linear_backward: dweight_squares without a dweight, or its slot " +
                    std::to_string(dweight_squares.slot) + " outside sums " + shape_str(dweight_squares.sums.shape));
  const int64_t C = inp.dim(-1), N = inp.numel() / C, OC = weight.dim(0);
  // An empty product assigns zeros (the GEMMs below do not run).
  if (write == GradWrite::Assign && !dinp.empty() && OC == 0) cpu::fill(dinp, 0.0f);
  if (param_write == GradWrite::Assign && !dweight.empty() && N == 0) cpu::fill(dweight, 0.0f);
  bool squared = false;
  if (check_dtypes("linear_backward",
                   {{&dinp, "dinp"}, {&dweight, "dweight"}, {&dbias, "dbias"}, {&dout, "dout"}, {&inp, "inp"},
                    {&weight, "weight"}})) {
    double fused = 0.0;
    squared = linear_backward_storage(dinp, dweight, dbias, dout, inp, weight, write, param_write,
                                      squares ? &fused : nullptr);
    if (squared) f64(dweight_squares.sums)[dweight_squares.slot] += fused;
  } else {
    const float* dy = f32(dout);
    const auto beta = [](GradWrite w) { return w == GradWrite::Assign ? 0.0f : 1.0f; };
    if (!dinp.empty()) sgemm(false, false, N, C, OC, 1.0f, dy, OC, f32(weight), C, beta(write), f32(dinp), C);
    if (!dweight.empty())
      sgemm(true, false, OC, C, N, 1.0f, dy, OC, f32(inp), C, beta(param_write), f32(dweight), C);
    if (!dbias.empty()) column_sums_into(dbias, dout, param_write);
  }
  if (squares && !squared) cpu::sum_squares(dweight_squares.sums, dweight_squares.slot, dweight);
}

void bias_add_forward(Tensor out, Tensor inp, Tensor bias) {
  const int64_t OC = bias.numel();
  TESSERA_CHECK(OC > 0 && out.ndim() >= 1 && out.dim(-1) == OC && inp.numel() == out.numel() &&
                    inp.dim(-1) == OC,
                "bias_add: out " + shape_str(out.shape) + ", inp " + shape_str(inp.shape) + ", bias " +
                    shape_str(bias.shape));
  for (auto [t, name] : {std::pair{&out, "out"}, {&inp, "inp"}, {&bias, "bias"}}) check_float(*t, "bias_add_forward", name);
  const int64_t N = out.numel() / OC;
  Stage params(Stage::Caller);
  const float* b = params.in(bias, 0, OC);
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < N; ++n) {
    Stage s;
    const float* x = s.in(inp, n * OC, OC);
    float* y = s.out(out, n * OC, OC);
#pragma omp simd
    for (int64_t o = 0; o < OC; ++o) y[o] = x[o] + b[o];
    s.done(out, n * OC, OC, y);
  }
}

void bias_add_backward(Tensor dbias, Tensor dout) { column_sums_into(dbias, dout, GradWrite::Accumulate); }

}  // namespace tessera::ops::cpu
