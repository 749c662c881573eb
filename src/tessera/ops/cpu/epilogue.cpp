// The fused epilogues of ops.h on the CPU: linear + bias + GeLU, and bias + dropout +
// residual add. Each makes one pass over its [N,OC] tensors where the unfused ops make
// two or three.
// Legend: N rows (leading dims flattened), C input channels, OC output channels (the last
// dim, the bias's length), B samples (the leading dim, for the dropout mask), S elements
// per sample, R = S / OC rows per sample.
//
// The backward passes that also sum the bias gradient walk column blocks: a thread owns a
// block of columns and walks the rows in order, as bias_add_backward does (the same bits
// for any thread count, and in f32 the unfused ops' bits). Blocks are as wide as the thread
// count allows (up to kMaxColumns), so each row of a block is a segment of a few KB per
// tensor rather than 256 bytes of rows 3-12 KB apart.
#include <omp.h>

#include <algorithm>
#include <initializer_list>
#include <string>
#include <utility>

#include "tessera/ops/cpu/cpu_ops.h"
#include "tessera/ops/cpu/dropout_mask.h"
#include "tessera/ops/cpu/gelu_math.h"
#include "tessera/ops/cpu/gemm.h"
#include "tessera/ops/cpu/low_precision.h"
#include "tessera/ops/cpu/storage.h"

namespace tessera::ops::cpu {
namespace {

constexpr int64_t kMaxColumns = 1024;  // columns of one block of column_blocks
constexpr int64_t kChunk = 64;         // columns per dropout-factor chunk of a row

// The column blocks of column_blocks over OC columns: a multiple of the thread count (so
// each thread gets the same share) of at most kMaxColumns columns, each a multiple of 16.
int64_t column_block_width(int64_t OC) {
  const int64_t threads = std::max(1, omp_get_max_threads());
  const int64_t blocks = ((OC + kMaxColumns - 1) / kMaxColumns + threads - 1) / threads * threads;
  return std::min(kMaxColumns, ((OC + blocks - 1) / blocks + 15) / 16 * 16);
}

// Calls row(n, o0, len, acc) for the rows n = 0..N-1 in order of every column block
// [o0, o0 + len) (len <= kMaxColumns), acc a block's running column sums, then adds them
// into dbias (when present, a parameter gradient written per `write`).
template <typename Row>
void column_blocks(int64_t N, int64_t OC, const Tensor& dbias, GradWrite write, Row row) {
  const int64_t width = column_block_width(OC), blocks = (OC + width - 1) / width;
  Stage grads(Stage::Caller);
  float* db = dbias.empty() ? nullptr : grads.grad(dbias, 0, OC, write);
#pragma omp parallel for schedule(static)
  for (int64_t blk = 0; blk < blocks; ++blk) {
    const int64_t o0 = blk * width, len = std::min(width, OC - o0);
    float acc[kMaxColumns] = {};
    for (int64_t n = 0; n < N; ++n) row(n, o0, len, acc);
    if (db)
      for (int64_t o = 0; o < len; ++o) db[o0 + o] += acc[o];
  }
  if (db) grads.done(dbias, 0, OC, db);
}

// v rounded to t's dtype (nothing for F32): a 16-bit gradient's value as stored, which the
// bias gradient sums as bias_add_backward sums the stored gradient.
float stored(const Tensor& t, float v) {
  return t.dtype == DType::F32 ? v : t.dtype == DType::BF16 ? round_bf16(v) : round_fp16(v);
}

// acc[o] += stored(t, v[o]) for o < len; a loop per dtype, so the F32 and BF16 ones vectorise.
void add_stored(float* acc, const float* v, int64_t len, const Tensor& t) {
  if (t.dtype == DType::F32) {
#pragma omp simd
    for (int64_t o = 0; o < len; ++o) acc[o] += v[o];
  } else if (t.dtype == DType::BF16) {
#pragma omp simd
    for (int64_t o = 0; o < len; ++o) acc[o] += round_bf16(v[o]);
  } else {
    for (int64_t o = 0; o < len; ++o) acc[o] += stored(t, v[o]);
  }
}

bool any_16bit(std::initializer_list<const Tensor*> tensors) {
  for (const Tensor* t : tensors)
    if (!t->empty() && t->dtype != DType::F32) return true;
  return false;
}

void check_floats(const char* op, std::initializer_list<std::pair<const Tensor*, const char*>> args) {
  for (auto [t, name] : args) check_float(*t, op, name);
}

// pre[n, :] += bias; out[n, :] = gelu(pre[n, :]) for the f32 rows n < N.
void bias_gelu_rows(float* out, float* pre, const float* bias, int64_t N, int64_t OC, GeluKind kind) {
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < N; ++n) {
    float* p = pre + n * OC;
    float* y = out + n * OC;
    if (bias) {
#pragma omp simd
      for (int64_t o = 0; o < OC; ++o) p[o] += bias[o];
    }
    if (kind == GeluKind::Tanh) {
#pragma omp simd
      for (int64_t o = 0; o < OC; ++o) y[o] = gelu_tanh(p[o]);
    } else {
#pragma omp simd
      for (int64_t o = 0; o < OC; ++o) y[o] = gelu_erf(p[o]);
    }
  }
}

int64_t leading_dim(const Tensor& t, const char* op) {
  TESSERA_CHECK(t.ndim() >= 2 && t.dim(0) > 0, std::string(op) + " needs [B, ..., OC] tensors, got " +
                                                   shape_str(t.shape));
  return t.dim(0);
}

}  // namespace

void linear_bias_gelu_forward(Tensor out, Tensor pre, Tensor inp, Tensor weight, Tensor bias, GeluKind kind) {
  const int64_t C = inp.dim(-1), N = inp.numel() / C, OC = weight.dim(0);
  TESSERA_CHECK(weight.ndim() == 2 && weight.dim(1) == C && pre.numel() == N * OC && pre.dim(-1) == OC &&
                    out.numel() == N * OC && (bias.empty() || bias.numel() == OC),
                "linear_bias_gelu: inp " + shape_str(inp.shape) + ", weight " + shape_str(weight.shape) + ", pre " +
                    shape_str(pre.shape) + ", out " + shape_str(out.shape));
  TESSERA_CHECK(!out.same_memory(pre), "linear_bias_gelu: out aliases pre");
  check_floats("linear_bias_gelu_forward",
               {{&out, "out"}, {&pre, "pre"}, {&inp, "inp"}, {&weight, "weight"}, {&bias, "bias"}});
  // 16-bit tensors: the linear's own path (products in f32, pre rounded once), then GeLU.
  if (any_16bit({&out, &pre, &inp, &weight, &bias})) {
    cpu::linear_forward(pre, inp, weight, bias);
    return cpu::gelu_forward(out, pre, kind);
  }
  float* p = f32(pre);
  const float* b = bias.empty() ? nullptr : f32(bias);
  // One GEMM over all rows, then one pass: oneDNN's sgemm on 64-row tiles (which the pass
  // would find in cache) ran 25% slower than on all 1024 rows of GPT-2's MLP at T=1024, more
  // than the pass gains from the cache (docs/benchmarks.md, issue #28's section).
  sgemm(false, true, N, OC, C, 1.0f, f32(inp), C, f32(weight), C, 0.0f, p, OC);
  bias_gelu_rows(f32(out), p, b, N, OC, kind);
}

void linear_bias_gelu_backward(Tensor dinp, Tensor dweight, Tensor dbias, Tensor dpre, Tensor dout, Tensor inp,
                               Tensor weight, Tensor pre, GeluKind kind, GradWrite write, GradWrite param_write,
                               GradSquares dweight_squares) {
  const int64_t OC = pre.dim(-1), N = pre.numel() / OC;
  TESSERA_CHECK(dpre.numel() == N * OC && dout.numel() == N * OC && weight.ndim() == 2 && weight.dim(0) == OC &&
                    (dbias.empty() || dbias.numel() == OC),
                "linear_bias_gelu backward: pre " + shape_str(pre.shape) + ", dpre " + shape_str(dpre.shape) +
                    ", dout " + shape_str(dout.shape) + ", weight " + shape_str(weight.shape));
  check_floats("linear_bias_gelu_backward", {{&dbias, "dbias"}, {&dpre, "dpre"}, {&dout, "dout"}, {&pre, "pre"}});
  // dpre = dout * gelu'(pre), read before written (dpre may be dout), with its column sums.
  column_blocks(N, OC, dbias, param_write, [&](int64_t n, int64_t o0, int64_t len, float* acc) {
    Stage s;
    const int64_t off = n * OC + o0;
    const float* x = s.in(pre, off, len);
    const float* dy = s.in(dout, off, len);
    float* dp = s.out(dpre, off, len);
    if (kind == GeluKind::Tanh) {
#pragma omp simd
      for (int64_t o = 0; o < len; ++o) dp[o] = dy[o] * gelu_tanh_grad(x[o]);
    } else {
#pragma omp simd
      for (int64_t o = 0; o < len; ++o) dp[o] = dy[o] * gelu_erf_grad(x[o]);
    }
    add_stored(acc, dp, len, dpre);
    s.done(dpre, off, len, dp);
  });
  cpu::linear_backward(dinp, dweight, Tensor(), dpre, inp, weight, write, param_write, dweight_squares);
}

void bias_dropout_add_forward(Tensor out, Tensor inp, Tensor bias, Tensor residual, const Dropout& dropout) {
  const int64_t n = inp.numel(), OC = inp.dim(-1), N = n / OC;
  TESSERA_CHECK(out.numel() == n && residual.numel() == n && (bias.empty() || bias.numel() == OC),
                "bias_dropout_add: out " + shape_str(out.shape) + ", inp " + shape_str(inp.shape) + ", bias " +
                    shape_str(bias.shape) + ", residual " + shape_str(residual.shape));
  check_floats("bias_dropout_add_forward", {{&out, "out"}, {&inp, "inp"}, {&bias, "bias"}, {&residual, "residual"}});
  const bool drop = dropout.p != 0.0f;
  if (drop) dropout_scale(dropout);  // checks p
  const int64_t R = drop ? N / leading_dim(inp, "bias_dropout_add_forward") : N;
  Stage params(Stage::Caller);
  const float* b = bias.empty() ? nullptr : params.in(bias, 0, OC);
  // A 16-bit inp: inp + bias and its dropped value rounded to inp's dtype, where the unfused
  // ops store them (bias_add_forward and dropout_forward in place), so the bits are theirs.
  const DType mid = inp.dtype;
  auto round_mid = [mid](float v) { return mid == DType::BF16 ? round_bf16(v) : round_fp16(v); };
#pragma omp parallel for schedule(static)
  for (int64_t row = 0; row < N; ++row) {
    const int64_t off = row * OC;
    Stage s;
    const float* x = s.in(inp, off, OC);
    const float* r = s.in(residual, off, OC);
    float* y = s.out(out, off, OC);
    for (int64_t o0 = 0; o0 < OC; o0 += kChunk) {
      const int64_t len = std::min(kChunk, OC - o0);
      float f[kChunk];
      if (drop)
        dropout_factors(dropout, row / R, static_cast<uint64_t>((row % R) * OC + o0), len, f);
      else
        std::fill(f, f + len, 1.0f);
      if (mid == DType::F32) {
#pragma omp simd
        for (int64_t o = 0; o < len; ++o) y[o0 + o] = r[o0 + o] + (x[o0 + o] + (b ? b[o0 + o] : 0.0f)) * f[o];
      } else if (mid == DType::BF16) {  // its own loop: the rounding vectorises (integer ops)
#pragma omp simd
        for (int64_t o = 0; o < len; ++o)
          y[o0 + o] = r[o0 + o] + round_bf16(round_bf16(x[o0 + o] + (b ? b[o0 + o] : 0.0f)) * f[o]);
      } else {
        for (int64_t o = 0; o < len; ++o)
          y[o0 + o] = r[o0 + o] + round_mid(round_mid(x[o0 + o] + (b ? b[o0 + o] : 0.0f)) * f[o]);
      }
    }
    s.done(out, off, OC, y);
  }
}

void bias_dropout_add_backward(Tensor dinp, Tensor dbias, Tensor dresidual, Tensor dout, const Dropout& dropout,
                               GradWrite write) {
  const int64_t n = dout.numel(), OC = dout.dim(-1), N = n / OC;
  TESSERA_CHECK((dinp.empty() || dinp.numel() == n) && (dresidual.empty() || dresidual.numel() == n) &&
                    (dbias.empty() || dbias.numel() == OC),
                "bias_dropout_add backward: dout " + shape_str(dout.shape) + ", dinp " + shape_str(dinp.shape) +
                    ", dbias " + shape_str(dbias.shape) + ", dresidual " + shape_str(dresidual.shape));
  TESSERA_CHECK(!dinp.same_memory(dout) && !dresidual.same_memory(dout),
                "bias_dropout_add backward: a gradient output aliases dout");
  check_floats("bias_dropout_add_backward",
               {{&dinp, "dinp"}, {&dbias, "dbias"}, {&dresidual, "dresidual"}, {&dout, "dout"}});
  const bool drop = dropout.p != 0.0f;
  if (drop) dropout_scale(dropout);  // checks p
  const int64_t R = drop ? N / leading_dim(dout, "bias_dropout_add_backward") : N;
  column_blocks(N, OC, dbias, GradWrite::Accumulate, [&](int64_t row, int64_t o0, int64_t len, float* acc) {
    Stage s;
    const int64_t off = row * OC + o0;
    const float* dy = s.in(dout, off, len);
    float f[kMaxColumns];
    if (drop)
      dropout_factors(dropout, row / R, static_cast<uint64_t>((row % R) * OC + o0), len, f);
    else
      std::fill(f, f + len, 1.0f);
    // The contribution dy * f, rounded (it is stored, so never fused into the adds below):
    // added to 0 it is dropout_backward's fma(dy, f, 0), and bias_add_backward sums it as
    // stored in a 16-bit dinp.
    float c[kMaxColumns];
#pragma omp simd
    for (int64_t o = 0; o < len; ++o) c[o] = dy[o] * f[o];
    add_stored(acc, c, len, dinp.empty() ? dout : dinp);
    if (!dinp.empty()) {
      float* dx = s.grad(dinp, off, len, write);
#pragma omp simd
      for (int64_t o = 0; o < len; ++o) dx[o] += c[o];
      s.done(dinp, off, len, dx);
    }
    if (!dresidual.empty()) {
      float* dr = s.grad(dresidual, off, len, write);
#pragma omp simd
      for (int64_t o = 0; o < len; ++o) dr[o] += dy[o];
      s.done(dresidual, off, len, dr);
    }
  });
}

}  // namespace tessera::ops::cpu
