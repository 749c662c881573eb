// Token + position embedding. Legend: N = B*T rows, C channels, Vl vocabulary rows of wte
// (the shard [vocab_start, vocab_start+Vl) of the full vocabulary), P position rows of wpe.
// Tokens outside the shard contribute nothing here: another tensor-parallel rank holds
// them and the caller's all-reduce adds its rows. Tables, out and dout may be of any float
// dtype (staged by rows, storage.h).
#include <omp.h>

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "tessera/ops/cpu/cpu_ops.h"
#include "tessera/ops/cpu/storage.h"
#include "tessera/ops/cpu/vocab_shard.h"

namespace tessera::ops::cpu {
namespace {

// The backward splits the channels between threads in multiples of this (a vector width).
constexpr int64_t kBlock = 16;

// The rows of dout that add into a table gradient, as (table row, row of dout) sorted:
// each table row's rows form one run, in row order. starts: where each run begins, plus
// the end.
struct Runs {
  std::vector<std::pair<int64_t, int64_t>> rows;
  std::vector<size_t> starts;
};

// index(n) is row n's table row, or -1 when row n adds nothing to this table.
template <typename Index>
Runs runs(int64_t N, Index index) {
  Runs r;
  for (int64_t n = 0; n < N; ++n)
    if (const int64_t k = index(n); k >= 0) r.rows.emplace_back(k, n);
  std::sort(r.rows.begin(), r.rows.end());
  for (size_t i = 0; i < r.rows.size(); ++i)
    if (i == 0 || r.rows[i].first != r.rows[i - 1].first) r.starts.push_back(i);
  r.starts.push_back(r.rows.size());
  return r;
}

// table[k, c0:c0+len] += dout[n, c0:c0+len] for the rows n of run i (table row k), in
// row order (the order of a plain loop over the rows), then rounded once into the table.
// buf: len floats for a 16-bit dout row.
void add_run(const Tensor& table, const Tensor& dout, const Runs& r, size_t i, int64_t C, int64_t c0, int64_t len,
             float* buf) {
  const int64_t k = r.rows[r.starts[i]].first;
  Stage s;
  float* t = s.inout(table, k * C + c0, len);
  for (size_t j = r.starts[i]; j < r.starts[i + 1]; ++j) {
    const float* g = read(dout, r.rows[j].second * C + c0, len, buf);
#pragma omp simd
    for (int64_t c = 0; c < len; ++c) t[c] += g[c];
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
  Runs by_token, by_position;
  if (!dwte.empty()) {
    TESSERA_CHECK(dwte.ndim() == 2 && dwte.dim(1) == C && tokens.numel() == N,
                  "embedding backward: dout " + shape_str(dout.shape) + ", dwte " + shape_str(dwte.shape) +
                      ", tokens " + shape_str(tokens.shape));
    const VocabShard shard = vocab_shard(vocab_start, dwte.dim(0), vocab_size, "embedding backward");
    const int32_t* tok = i32(tokens);
    check_ids(tok, N, shard.total, "token id");
    by_token = runs(N, [&](int64_t n) { return shard.holds(tok[n]) ? int64_t{tok[n] - shard.start} : -1; });
  }
  if (!dwpe.empty()) {
    TESSERA_CHECK(dwpe.ndim() == 2 && dwpe.dim(1) == C && positions.numel() == N,
                  "embedding backward: dout " + shape_str(dout.shape) + ", dwpe " + shape_str(dwpe.shape) +
                      ", positions " + shape_str(positions.shape));
    const int32_t* pos = i32(positions);
    check_ids(pos, N, dwpe.dim(0), "position id");
    by_position = runs(N, [&](int64_t n) { return static_cast<int64_t>(pos[n]); });
  }
  // Several rows may hit the same token (or position), so threads split the channels, not
  // the rows: each thread owns a range of channels of both tables, no two threads ever add
  // to the same element, and every element sums its rows in order n = 0, 1, ... (bitwise
  // the same result for any thread count), rounding a 16-bit table once.
#pragma omp parallel
  {
    const int64_t blocks = (C + kBlock - 1) / kBlock, threads = omp_get_num_threads(), id = omp_get_thread_num();
    const int64_t c0 = std::min(C, blocks * id / threads * kBlock), c1 = std::min(C, blocks * (id + 1) / threads * kBlock);
    std::vector<float> buf(static_cast<size_t>(c1 - c0));
    for (size_t i = 0; c1 > c0 && i + 1 < by_token.starts.size(); ++i)
      add_run(dwte, dout, by_token, i, C, c0, c1 - c0, buf.data());
    for (size_t i = 0; c1 > c0 && i + 1 < by_position.starts.size(); ++i)
      add_run(dwpe, dout, by_position, i, C, c0, c1 - c0, buf.data());
  }
}

}  // namespace tessera::ops::cpu
