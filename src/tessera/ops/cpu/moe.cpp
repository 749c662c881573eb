// The mixture-of-experts ops (ops.inc): permuting token rows into expert order and back
// with the routing weights, and the experts' grouped GEMMs as one linear per group. Rows are
// independent, so each loop is OpenMP over rows and gives the same bits for any thread count.
#include <string>

#include "tessera/ops/cpu/cpu_ops.h"
#include "tessera/ops/cpu/shape_checks.h"
#include "tessera/ops/cpu/storage.h"

namespace tessera::ops::cpu {
namespace {

// A token table: [rows, cols] of a floating dtype.
void check_float_rows(const Tensor& t, int64_t rows, int64_t cols, const char* op, const char* arg) {
  check_rows(t, rows, cols, op, arg);
  check_float(t, op, arg);
}

// Checks that a map entry names a row of a table of `rows` rows (-1: none).
int32_t checked(int32_t v, int64_t rows, const char* op) {
  TESSERA_CHECK(v >= -1 && v < rows, std::string(op) + ": map entry " + std::to_string(v) + " outside [-1, " +
                                         std::to_string(rows) + ")");
  return v;
}

}  // namespace

void moe_permute_forward(Tensor out, Tensor inp, Tensor sources, int64_t topk) {
  const int64_t M = out.dim(0), C = out.dim(-1), N = inp.dim(0);
  check_float_rows(out, M, C, "moe_permute_forward", "out");
  check_float_rows(inp, N, C, "moe_permute_forward", "inp");
  check_map(sources, M, "moe_permute_forward", "sources");
  TESSERA_CHECK(topk > 0, "moe_permute_forward: topk must be > 0");
  const int32_t* src = i32(sources);
#pragma omp parallel for schedule(static)
  for (int64_t m = 0; m < M; ++m) {
    const int32_t r = checked(src[m], N * topk, "moe_permute_forward");
    Stage s;
    float* o = s.out(out, m * C, C);
    if (r < 0) {
      std::fill(o, o + C, 0.0f);
    } else {
      const float* x = s.in(inp, (r / topk) * C, C);
      std::copy(x, x + C, o);
    }
    s.done(out, m * C, C, o);
  }
}

void moe_permute_backward(Tensor dinp, Tensor dout, Tensor slots, GradWrite write) {
  const int64_t N = dinp.dim(0), C = dinp.dim(-1), M = dout.dim(0);
  check_float_rows(dinp, N, C, "moe_permute_backward", "dinp");
  check_float_rows(dout, M, C, "moe_permute_backward", "dout");
  TESSERA_CHECK(N > 0 && slots.numel() % N == 0, "moe_permute_backward: slots " + shape_str(slots.shape));
  check_map(slots, slots.numel(), "moe_permute_backward", "slots");
  const int64_t k = slots.numel() / N;
  const int32_t* slot = i32(slots);
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < N; ++n) {
    Stage s;
    float* d = s.grad(dinp, n * C, C, write);
    for (int64_t j = 0; j < k; ++j) {
      const int32_t m = checked(slot[n * k + j], M, "moe_permute_backward");
      if (m < 0) continue;
      Stage route(Stage::Caller);  // one block per route: k may exceed a Stage's blocks
      const float* g = route.in(dout, m * C, C);
#pragma omp simd
      for (int64_t c = 0; c < C; ++c) d[c] += g[c];
    }
    s.done(dinp, n * C, C, d);
  }
}

void moe_unpermute_forward(Tensor out, Tensor inp, Tensor slots, Tensor weights) {
  const int64_t N = out.dim(0), C = out.dim(-1), M = inp.dim(0);
  check_float_rows(out, N, C, "moe_unpermute_forward", "out");
  check_float_rows(inp, M, C, "moe_unpermute_forward", "inp");
  const int64_t k = N > 0 ? weights.numel() / N : 0;
  check_map(slots, N * k, "moe_unpermute_forward", "slots");
  const float* w = f32_arg(weights, "moe_unpermute_forward", "weights");
  const int32_t* slot = i32(slots);
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < N; ++n) {
    Stage s;
    float* o = s.out(out, n * C, C);
    std::fill(o, o + C, 0.0f);
    for (int64_t j = 0; j < k; ++j) {
      const int32_t m = checked(slot[n * k + j], M, "moe_unpermute_forward");
      if (m < 0) continue;
      Stage route(Stage::Caller);
      const float* x = route.in(inp, m * C, C);
      const float wj = w[n * k + j];
#pragma omp simd
      for (int64_t c = 0; c < C; ++c) o[c] += wj * x[c];
    }
    s.done(out, n * C, C, o);
  }
}

void moe_unpermute_backward(Tensor dinp, Tensor dweights, Tensor dout, Tensor inp, Tensor sources, Tensor weights) {
  const int64_t M = dinp.dim(0), C = dinp.dim(-1), N = dout.dim(0);
  check_float_rows(dinp, M, C, "moe_unpermute_backward", "dinp");
  check_float_rows(dout, N, C, "moe_unpermute_backward", "dout");
  check_float_rows(inp, M, C, "moe_unpermute_backward", "inp");
  check_map(sources, M, "moe_unpermute_backward", "sources");
  const int64_t k = N > 0 ? weights.numel() / N : 0;
  const float* w = f32_arg(weights, "moe_unpermute_backward", "weights");
  float* dw = f32_arg(dweights, "moe_unpermute_backward", "dweights");
  TESSERA_CHECK(dweights.numel() == N * k, "moe_unpermute_backward: dweights " + shape_str(dweights.shape));
  const int32_t* src = i32(sources);
  std::fill(dw, dw + N * k, 0.0f);
#pragma omp parallel for schedule(static)
  for (int64_t m = 0; m < M; ++m) {
    const int32_t r = checked(src[m], N * k, "moe_unpermute_backward");
    Stage s;
    float* d = s.out(dinp, m * C, C);
    if (r < 0) {
      std::fill(d, d + C, 0.0f);
    } else {
      const float* g = s.in(dout, (r / k) * C, C);
      const float* x = s.in(inp, m * C, C);
      const float wr = w[r];
      float dot = 0.0f;
#pragma omp simd reduction(+ : dot)
      for (int64_t c = 0; c < C; ++c) {
        d[c] = wr * g[c];
        dot += g[c] * x[c];
      }
      dw[r] = dot;  // each route has one row
    }
    s.done(dinp, m * C, C, d);
  }
}

void grouped_linear_forward(Tensor out, Tensor inp, const std::vector<Tensor>& weights,
                            const std::vector<int64_t>& group_rows) {
  TESSERA_CHECK(weights.size() == group_rows.size(), "grouped_linear_forward: one row count per weight");
  int64_t row = 0;
  for (size_t g = 0; g < weights.size(); ++g) {
    if (group_rows[g] > 0)
      linear_forward(out.slice_rows(row, group_rows[g]), inp.slice_rows(row, group_rows[g]), weights[g], Tensor());
    row += group_rows[g];
  }
  TESSERA_CHECK(row == out.dim(0) && row == inp.dim(0), "grouped_linear_forward: the groups' rows (" +
                                                           std::to_string(row) + ") differ from inp " +
                                                           shape_str(inp.shape) + " / out " + shape_str(out.shape));
}

void grouped_linear_backward(Tensor dinp, const std::vector<Tensor>& dweights, Tensor dout, Tensor inp,
                             const std::vector<Tensor>& weights, const std::vector<int64_t>& group_rows,
                             GradWrite write) {
  TESSERA_CHECK(weights.size() == group_rows.size() && (dweights.empty() || dweights.size() == weights.size()),
                "grouped_linear_backward: one row count and weight gradient per weight");
  int64_t row = 0;
  for (size_t g = 0; g < weights.size(); ++g) {
    const int64_t n = group_rows[g];
    if (n > 0)
      linear_backward(dinp.empty() ? dinp : dinp.slice_rows(row, n), dweights.empty() ? Tensor() : dweights[g], Tensor(),
                      dout.slice_rows(row, n), inp.slice_rows(row, n), weights[g], write,
                      GradWrite::Accumulate, GradSquares());
    row += n;
  }
  TESSERA_CHECK(row == dout.dim(0), "grouped_linear_backward: the groups' rows (" + std::to_string(row) +
                                        ") differ from dout " + shape_str(dout.shape));
}

}  // namespace tessera::ops::cpu
