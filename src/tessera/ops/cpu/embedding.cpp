// Token + position embedding. Legend: N = B*T rows, C channels, V vocabulary rows of wte,
// P position rows of wpe.
#include <algorithm>
#include <string>

#include "tessera/ops/cpu/cpu_ops.h"

namespace tessera::ops::cpu {
namespace {

// Indices come from data files and flags, but by the time they reach a kernel they are an
// invariant: an out-of-range id would read or write outside the table.
void check_indices(const int32_t* idx, int64_t n, int64_t rows, const char* what) {
  for (int64_t i = 0; i < n; ++i)
    TESSERA_CHECK(idx[i] >= 0 && idx[i] < rows, std::string(what) + " " + std::to_string(idx[i]) + " at " +
                                                    std::to_string(i) + " outside [0, " + std::to_string(rows) + ")");
}

}  // namespace

void embedding_forward(Tensor out, Tensor tokens, Tensor positions, Tensor wte, Tensor wpe) {
  const int64_t N = tokens.numel(), C = wte.dim(-1);
  TESSERA_CHECK(positions.numel() == N, "embedding: tokens " + shape_str(tokens.shape) + " vs positions " +
                                            shape_str(positions.shape));
  TESSERA_CHECK(wpe.dim(-1) == C && out.numel() == N * C, "embedding: out " + shape_str(out.shape) + ", wte " +
                                                              shape_str(wte.shape) + ", wpe " + shape_str(wpe.shape));
  const int32_t* tok = tokens.i32();
  const int32_t* pos = positions.i32();
  check_indices(tok, N, wte.dim(0), "token id");
  check_indices(pos, N, wpe.dim(0), "position id");
  const float* te = wte.f32();
  const float* pe = wpe.f32();
  float* y = out.f32();
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < N; ++n) {
    const float* a = te + static_cast<int64_t>(tok[n]) * C;
    const float* b = pe + static_cast<int64_t>(pos[n]) * C;
    float* o = y + n * C;
#pragma omp simd
    for (int64_t c = 0; c < C; ++c) o[c] = a[c] + b[c];
  }
}

void embedding_backward(Tensor dwte, Tensor dwpe, Tensor dout, Tensor tokens, Tensor positions) {
  const int64_t N = tokens.numel(), C = dout.dim(-1);
  TESSERA_CHECK(positions.numel() == N && dout.numel() == N * C,
                "embedding backward: dout " + shape_str(dout.shape) + " vs tokens " + shape_str(tokens.shape));
  const int32_t* tok = tokens.i32();
  const int32_t* pos = positions.i32();
  const float* dy = dout.f32();
  float* dte = dwte.empty() ? nullptr : dwte.f32();
  float* dpe = dwpe.empty() ? nullptr : dwpe.f32();
  if (dte) {
    TESSERA_CHECK(dwte.dim(-1) == C, "embedding backward: dwte " + shape_str(dwte.shape));
    check_indices(tok, N, dwte.dim(0), "token id");
  }
  if (dpe) {
    TESSERA_CHECK(dwpe.dim(-1) == C, "embedding backward: dwpe " + shape_str(dwpe.shape));
    check_indices(pos, N, dwpe.dim(0), "position id");
  }
  // Several rows may hit the same token (or position), so threads split the channels, not
  // the rows: each thread owns a column block of both tables, no two threads ever add to
  // the same element, and every element sums its rows in order n = 0, 1, ... (bitwise the
  // same result for any thread count).
  constexpr int64_t kBlock = 64;
  const int64_t blocks = (C + kBlock - 1) / kBlock;
#pragma omp parallel for schedule(static)
  for (int64_t blk = 0; blk < blocks; ++blk) {
    const int64_t c0 = blk * kBlock, c1 = std::min(C, c0 + kBlock);
    for (int64_t n = 0; n < N; ++n) {
      const float* g = dy + n * C;
      if (dte) {
        float* t = dte + static_cast<int64_t>(tok[n]) * C;
#pragma omp simd
        for (int64_t c = c0; c < c1; ++c) t[c] += g[c];
      }
      if (dpe) {
        float* p = dpe + static_cast<int64_t>(pos[n]) * C;
#pragma omp simd
        for (int64_t c = c0; c < c1; ++c) p[c] += g[c];
      }
    }
  }
}

}  // namespace tessera::ops::cpu
