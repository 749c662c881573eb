// Token + position embedding. Legend: N = B*T rows, C channels, Vl vocabulary rows of wte
// (the shard [vocab_start, vocab_start+Vl) of the full vocabulary), P position rows of wpe.
// Tokens outside the shard contribute nothing here: another tensor-parallel rank holds
// them and the caller's all-reduce adds its rows. Tables, out and dout may be of any float
// dtype (staged by rows, storage.h).
#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "tessera/ops/cpu/cpu_ops.h"
#include "tessera/ops/cpu/storage.h"
#include "tessera/ops/cpu/vocab_shard.h"

namespace tessera::ops::cpu {
namespace {

// Channels per column block of the backward.
constexpr int64_t kBlock = 64;

// The rows of dout that add into each row of a table gradient, each row's list in row
// order: first[k] is the first row n with index k (-1: none), next[n] the following row
// with the same index (-1: the last). used lists the table rows with any.
struct Chains {
  std::vector<int64_t> first, next, used;
};

// index(n) is row n's table row, or -1 when row n adds nothing to this table.
template <typename Index>
Chains chains(int64_t rows, int64_t N, Index index) {
  Chains c{std::vector<int64_t>(static_cast<size_t>(rows), -1), std::vector<int64_t>(static_cast<size_t>(N), -1), {}};
  for (int64_t n = N - 1; n >= 0; --n) {
    const int64_t k = index(n);
    if (k < 0) continue;
    if (c.first[k] < 0) c.used.push_back(k);
    c.next[n] = c.first[k];
    c.first[k] = n;
  }
  return c;
}

// table[k, c0:c0+len] += dout[n, c0:c0+len] for the rows n of k's chain, in row order (the
// order of a plain loop over the rows), then rounded once into the table.
void add_chain(const Tensor& table, const Tensor& dout, const Chains& c, int64_t k, int64_t C, int64_t c0,
               int64_t len) {
  TESSERA_CHECK(len <= kBlock, "embedding backward: column block too wide");
  Stage s;
  float* t = s.inout(table, k * C + c0, len);
  float buf[kBlock];
  for (int64_t n = c.first[k]; n >= 0; n = c.next[n]) {
    const float* g = read(dout, n * C + c0, len, buf);
#pragma omp simd
    for (int64_t i = 0; i < len; ++i) t[i] += g[i];
  }
  s.done(table, k * C + c0, len, t);
}

}  // namespace

void embedding_forward(Tensor out, Tensor tokens, Tensor positions, Tensor wte, Tensor wpe, int64_t vocab_start,
                       int64_t vocab_size) {
  TESSERA_CHECK(out.ndim() >= 1 && out.dim(-1) > 0, "embedding: out " + shape_str(out.shape));
  for (auto [t, name] : {std::pair{&out, "out"}, {&wte, "wte"}, {&wpe, "wpe"}}) check_float(*t, "embedding_forward", name);
  const int64_t C = out.dim(-1), N = out.numel() / C;
  const int32_t* tok = nullptr;
  VocabShard shard;
  if (!wte.empty()) {
    TESSERA_CHECK(wte.ndim() == 2 && wte.dim(1) == C && tokens.numel() == N,
                  "embedding: out " + shape_str(out.shape) + ", wte " + shape_str(wte.shape) + ", tokens " +
                      shape_str(tokens.shape));
    shard = vocab_shard(vocab_start, wte.dim(0), vocab_size, "embedding");
    tok = i32(tokens);
    check_ids(tok, N, shard.total, "token id");
  }
  const int32_t* pos = nullptr;
  if (!wpe.empty()) {
    TESSERA_CHECK(wpe.ndim() == 2 && wpe.dim(1) == C && positions.numel() == N,
                  "embedding: out " + shape_str(out.shape) + ", wpe " + shape_str(wpe.shape) + ", positions " +
                      shape_str(positions.shape));
    pos = i32(positions);
    check_ids(pos, N, wpe.dim(0), "position id");
  }
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < N; ++n) {
    Stage s;
    const float* a = tok && shard.holds(tok[n]) ? s.in(wte, (tok[n] - shard.start) * C, C) : nullptr;
    const float* b = pos ? s.in(wpe, static_cast<int64_t>(pos[n]) * C, C) : nullptr;
    float* o = s.out(out, n * C, C);
    if (a && b) {
#pragma omp simd
      for (int64_t c = 0; c < C; ++c) o[c] = a[c] + b[c];
    } else if (a || b) {
      std::copy(a ? a : b, (a ? a : b) + C, o);
    } else {
      std::fill(o, o + C, 0.0f);
    }
    s.done(out, n * C, C, o);
  }
}

void embedding_backward(Tensor dwte, Tensor dwpe, Tensor dout, Tensor tokens, Tensor positions, int64_t vocab_start,
                        int64_t vocab_size) {
  TESSERA_CHECK(dout.ndim() >= 1 && dout.dim(-1) > 0, "embedding backward: dout " + shape_str(dout.shape));
  for (auto [t, name] : {std::pair{&dout, "dout"}, {&dwte, "dwte"}, {&dwpe, "dwpe"}})
    check_float(*t, "embedding_backward", name);
  const int64_t C = dout.dim(-1), N = dout.numel() / C;
  Chains by_token, by_position;
  if (!dwte.empty()) {
    TESSERA_CHECK(dwte.ndim() == 2 && dwte.dim(1) == C && tokens.numel() == N,
                  "embedding backward: dout " + shape_str(dout.shape) + ", dwte " + shape_str(dwte.shape) +
                      ", tokens " + shape_str(tokens.shape));
    const VocabShard shard = vocab_shard(vocab_start, dwte.dim(0), vocab_size, "embedding backward");
    const int32_t* tok = i32(tokens);
    check_ids(tok, N, shard.total, "token id");
    by_token = chains(dwte.dim(0), N, [&](int64_t n) { return shard.holds(tok[n]) ? tok[n] - shard.start : -1; });
  }
  if (!dwpe.empty()) {
    TESSERA_CHECK(dwpe.ndim() == 2 && dwpe.dim(1) == C && positions.numel() == N,
                  "embedding backward: dout " + shape_str(dout.shape) + ", dwpe " + shape_str(dwpe.shape) +
                      ", positions " + shape_str(positions.shape));
    const int32_t* pos = i32(positions);
    check_ids(pos, N, dwpe.dim(0), "position id");
    by_position = chains(dwpe.dim(0), N, [&](int64_t n) { return static_cast<int64_t>(pos[n]); });
  }
  // Several rows may hit the same token (or position), so threads split the channels, not
  // the rows: each thread owns a column block of both tables, no two threads ever add to
  // the same element, and every element sums its rows in order n = 0, 1, ... (bitwise the
  // same result for any thread count), rounding a 16-bit table once.
  const int64_t blocks = (C + kBlock - 1) / kBlock;
#pragma omp parallel for schedule(static)
  for (int64_t blk = 0; blk < blocks; ++blk) {
    const int64_t c0 = blk * kBlock, len = std::min(kBlock, C - c0);
    for (int64_t k : by_token.used) add_chain(dwte, dout, by_token, k, C, c0, len);
    for (int64_t k : by_position.used) add_chain(dwpe, dout, by_position, k, C, c0, len);
  }
}

}  // namespace tessera::ops::cpu
