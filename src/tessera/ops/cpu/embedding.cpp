// Token + position embedding. Legend: N = B*T rows, C channels, Vl vocabulary rows of wte
// (the shard [vocab_start, vocab_start+Vl) of the full vocabulary), P position rows of wpe.
// Tokens outside the shard contribute nothing here: another tensor-parallel rank holds
// them and the caller's all-reduce adds its rows.
#include <algorithm>
#include <string>

#include "tessera/ops/cpu/cpu_ops.h"
#include "tessera/ops/cpu/vocab_shard.h"

namespace tessera::ops::cpu {

void embedding_forward(Tensor out, Tensor tokens, Tensor positions, Tensor wte, Tensor wpe, int64_t vocab_start,
                       int64_t vocab_size) {
  TESSERA_CHECK(out.ndim() >= 1 && out.dim(-1) > 0, "embedding: out " + shape_str(out.shape));
  const int64_t C = out.dim(-1), N = out.numel() / C;
  const int32_t* tok = nullptr;
  const float* te = nullptr;
  VocabShard shard;
  if (!wte.empty()) {
    TESSERA_CHECK(wte.ndim() == 2 && wte.dim(1) == C && tokens.numel() == N,
                  "embedding: out " + shape_str(out.shape) + ", wte " + shape_str(wte.shape) + ", tokens " +
                      shape_str(tokens.shape));
    shard = vocab_shard(vocab_start, wte.dim(0), vocab_size, "embedding");
    tok = i32(tokens);
    check_ids(tok, N, shard.total, "token id");
    te = f32(wte);
  }
  const int32_t* pos = nullptr;
  const float* pe = nullptr;
  if (!wpe.empty()) {
    TESSERA_CHECK(wpe.ndim() == 2 && wpe.dim(1) == C && positions.numel() == N,
                  "embedding: out " + shape_str(out.shape) + ", wpe " + shape_str(wpe.shape) + ", positions " +
                      shape_str(positions.shape));
    pos = i32(positions);
    check_ids(pos, N, wpe.dim(0), "position id");
    pe = f32(wpe);
  }
  float* y = f32(out);
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < N; ++n) {
    const float* a = te && shard.holds(tok[n]) ? te + (tok[n] - shard.start) * C : nullptr;
    const float* b = pe ? pe + static_cast<int64_t>(pos[n]) * C : nullptr;
    float* o = y + n * C;
    if (a && b) {
#pragma omp simd
      for (int64_t c = 0; c < C; ++c) o[c] = a[c] + b[c];
    } else if (a || b) {
      std::copy(a ? a : b, (a ? a : b) + C, o);
    } else {
      std::fill(o, o + C, 0.0f);
    }
  }
}

void embedding_backward(Tensor dwte, Tensor dwpe, Tensor dout, Tensor tokens, Tensor positions, int64_t vocab_start,
                        int64_t vocab_size) {
  TESSERA_CHECK(dout.ndim() >= 1 && dout.dim(-1) > 0, "embedding backward: dout " + shape_str(dout.shape));
  const int64_t C = dout.dim(-1), N = dout.numel() / C;
  const float* dy = f32(dout);
  const int32_t* tok = nullptr;
  float* dte = nullptr;
  VocabShard shard;
  if (!dwte.empty()) {
    TESSERA_CHECK(dwte.ndim() == 2 && dwte.dim(1) == C && tokens.numel() == N,
                  "embedding backward: dout " + shape_str(dout.shape) + ", dwte " + shape_str(dwte.shape) +
                      ", tokens " + shape_str(tokens.shape));
    shard = vocab_shard(vocab_start, dwte.dim(0), vocab_size, "embedding backward");
    tok = i32(tokens);
    check_ids(tok, N, shard.total, "token id");
    dte = f32(dwte);
  }
  const int32_t* pos = nullptr;
  float* dpe = nullptr;
  if (!dwpe.empty()) {
    TESSERA_CHECK(dwpe.ndim() == 2 && dwpe.dim(1) == C && positions.numel() == N,
                  "embedding backward: dout " + shape_str(dout.shape) + ", dwpe " + shape_str(dwpe.shape) +
                      ", positions " + shape_str(positions.shape));
    pos = i32(positions);
    check_ids(pos, N, dwpe.dim(0), "position id");
    dpe = f32(dwpe);
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
      if (dte && shard.holds(tok[n])) {
        float* t = dte + (tok[n] - shard.start) * C;
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
