// Softmax cross-entropy over a vocabulary shard, in the pieces of ops.h (the caller
// all-reduces between them; with one rank they compose to the plain loss).
// Legend: N rows (= B*T), Vl the local vocabulary columns (50304 for unsharded GPT-2),
// logits, dlogits: [N,Vl] of any float dtype (staged row by row, storage.h: the
// statistics are computed in f32 and a 16-bit dlogits row is rounded once); targets: i32
// [N] (full-vocabulary ids); the rest: f32 [N].
// A row of logits is 200 KB, so the cost is memory passes and exps: the forward makes one
// pass for the max (cross_entropy_max) and one for sum(exp(x - max)) (cross_entropy_sums),
// or, unsharded, one pass from memory for both (cross_entropy_stats: the sums re-read the
// row from L2); the backward makes one pass given the logsumexp. The default mode's exp is
// exp_fast; --deterministic-mode keeps exp_approx and its recorded bits. Both vectorise.
#include <cmath>
#include <initializer_list>
#include <limits>
#include <string>

#include "tessera/device/device.h"
#include "tessera/ops/cpu/cpu_ops.h"
#include "tessera/ops/cpu/fast_math.h"
#include "tessera/ops/cpu/storage.h"
#include "tessera/ops/cpu/vocab_shard.h"

namespace tessera::ops::cpu {
namespace {

// Rows of logits (and the per-row tensors, all [N]); returns N.
int64_t check_rows(const Tensor& logits, std::initializer_list<const Tensor*> per_row, const char* op) {
  TESSERA_CHECK(logits.ndim() >= 1 && logits.dim(-1) > 0, std::string(op) + ": logits " + shape_str(logits.shape));
  const int64_t N = logits.numel() / logits.dim(-1);
  for (const Tensor* t : per_row)
    TESSERA_CHECK(t->numel() == N, std::string(op) + ": logits " + shape_str(logits.shape) + " vs per-row " +
                                       shape_str(t->shape));
  return N;
}

template <bool Fast>
inline float row_exp(float x) {
  return Fast ? exp_fast(x) : exp_approx(x);
}

float max_of_row(const float* x, int64_t V) {
  float mx = -std::numeric_limits<float>::infinity();
#pragma omp simd reduction(max : mx)
  for (int64_t v = 0; v < V; ++v) mx = x[v] > mx ? x[v] : mx;
  return mx;
}

// sum(exp(x[v] - m)) over one row, in kLanes fixed partial sums (element v goes to
// partial v % kLanes) added in order at the end: the same bits for any vector width, and
// each partial takes only V/kLanes terms. A single running sum (which is what the
// compiler's in-order reduction gives) loses every term below half an ulp of the total:
// -6e-5 relative on a 50304-wide row of N(0,3) logits, against ~1e-6 here.
template <bool Fast>
float row_sum_exp(const float* x, int64_t V, float m) {
  constexpr int64_t kLanes = 32;
  float acc[kLanes] = {};
  int64_t v = 0;
  for (; v + kLanes <= V; v += kLanes) {
#pragma omp simd
    for (int64_t j = 0; j < kLanes; ++j) acc[j] += row_exp<Fast>(x[v + j] - m);
  }
  for (int64_t j = 0; v + j < V; ++j) acc[j] += row_exp<Fast>(x[v + j] - m);
  float sum = 0.0f;
  for (int64_t j = 0; j < kLanes; ++j) sum += acc[j];
  return sum;
}

float row_sum_exp(const float* x, int64_t V, float m, bool fast) {
  return fast ? row_sum_exp<true>(x, V, m) : row_sum_exp<false>(x, V, m);
}

// dx[v] (+)= exp(x[v] - lse) * d over one row (x may be dx).
template <bool Fast>
void row_softmax_grad(float* dx, const float* x, int64_t V, float lse, float d, GradWrite write) {
  if (write == GradWrite::Assign) {
#pragma omp simd
    for (int64_t v = 0; v < V; ++v) dx[v] = 0.0f + row_exp<Fast>(x[v] - lse) * d;
  } else {
#pragma omp simd
    for (int64_t v = 0; v < V; ++v) dx[v] += row_exp<Fast>(x[v] - lse) * d;
  }
}

}  // namespace

void cross_entropy_max(Tensor row_max, Tensor logits) {
  const int64_t N = check_rows(logits, {&row_max}, "cross_entropy_max"), V = logits.dim(-1);
  check_float(logits, "cross_entropy_max", "logits");
  float* m = f32_arg(row_max, "cross_entropy_max", "row_max");
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < N; ++n) {
    Stage s;
    m[n] = max_of_row(s.in(logits, n * V, V), V);
  }
}

void cross_entropy_sums(Tensor sum_exp, Tensor target_logit, Tensor logits, Tensor targets, Tensor row_max,
                        int64_t vocab_start, int64_t vocab_size) {
  const int64_t N = check_rows(logits, {&sum_exp, &target_logit, &targets, &row_max}, "cross_entropy_sums");
  const int64_t V = logits.dim(-1);
  const VocabShard shard = vocab_shard(vocab_start, V, vocab_size, "cross_entropy_sums");
  const int32_t* tgt = i32(targets);
  check_ids(tgt, N, shard.total, "cross-entropy target");
  check_float(logits, "cross_entropy_sums", "logits");
  const float* m = f32_arg(row_max, "cross_entropy_sums", "row_max");
  float* se = f32_arg(sum_exp, "cross_entropy_sums", "sum_exp");
  float* tl = f32_arg(target_logit, "cross_entropy_sums", "target_logit");
  const bool fast = !deterministic_mode(logits);  // exp_approx keeps the recorded bits
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < N; ++n) {
    Stage s;
    const float* xn = s.in(logits, n * V, V);
    se[n] = row_sum_exp(xn, V, m[n], fast);
    // 0 when another rank holds the target: the all-reduced sum is then exactly its logit.
    tl[n] = shard.holds(tgt[n]) ? xn[tgt[n] - shard.start] : 0.0f;
  }
}

void cross_entropy_stats(Tensor row_max, Tensor sum_exp, Tensor target_logit, Tensor logits, Tensor targets) {
  const char* op = "cross_entropy_stats";
  const int64_t N = check_rows(logits, {&row_max, &sum_exp, &target_logit, &targets}, op), V = logits.dim(-1);
  const int32_t* tgt = i32(targets);
  check_ids(tgt, N, V, "cross-entropy target");
  check_float(logits, op, "logits");
  float* m = f32_arg(row_max, op, "row_max");
  float* se = f32_arg(sum_exp, op, "sum_exp");
  float* tl = f32_arg(target_logit, op, "target_logit");
  const bool fast = !deterministic_mode(logits);  // exp_approx keeps the recorded bits
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < N; ++n) {
    Stage s;
    const float* xn = s.in(logits, n * V, V);
    m[n] = max_of_row(xn, V);
    se[n] = row_sum_exp(xn, V, m[n], fast);  // the row is in L2 now: one pass from memory
    tl[n] = xn[tgt[n]];
  }
}

void cross_entropy_finish(Tensor losses, Tensor logsumexp, Tensor sum_exp, Tensor row_max, Tensor target_logit) {
  const int64_t N = losses.numel();
  for (const Tensor* t : {&logsumexp, &sum_exp, &row_max, &target_logit})
    TESSERA_CHECK(t->numel() == N, "cross_entropy_finish: losses " + shape_str(losses.shape) + " vs " +
                                       shape_str(t->shape));
  const char* op = "cross_entropy_finish";
  const float* se = f32_arg(sum_exp, op, "sum_exp");
  const float* m = f32_arg(row_max, op, "row_max");
  const float* tl = f32_arg(target_logit, op, "target_logit");
  float* lse = f32_arg(logsumexp, op, "logsumexp");
  float* loss = f32_arg(losses, op, "losses");
  for (int64_t n = 0; n < N; ++n) {
    lse[n] = m[n] + std::log(se[n]);
    loss[n] = lse[n] - tl[n];
  }
}

void cross_entropy_backward(Tensor dlogits, Tensor dlosses, Tensor logits, Tensor targets, Tensor logsumexp,
                            int64_t vocab_start, int64_t vocab_size, GradWrite write) {
  const int64_t N = check_rows(logits, {&dlosses, &targets, &logsumexp}, "cross_entropy_backward");
  const int64_t V = logits.dim(-1);
  TESSERA_CHECK(dlogits.numel() == logits.numel() && dlogits.dim(-1) == V,
                "cross_entropy_backward: dlogits " + shape_str(dlogits.shape) + " vs logits " +
                    shape_str(logits.shape));
  check_in_place(dlogits, logits, write);
  const VocabShard shard = vocab_shard(vocab_start, V, vocab_size, "cross_entropy_backward");
  const int32_t* tgt = i32(targets);
  check_ids(tgt, N, shard.total, "cross-entropy target");
  check_float(logits, "cross_entropy_backward", "logits");
  check_float(dlogits, "cross_entropy_backward", "dlogits");
  const float* dl = f32_arg(dlosses, "cross_entropy_backward", "dlosses");
  const float* lse = f32_arg(logsumexp, "cross_entropy_backward", "logsumexp");
  const bool fast = !deterministic_mode(logits);  // exp_approx keeps the recorded bits
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < N; ++n) {
    Stage s;
    const float* xn = s.in(logits, n * V, V);
    // In place (dlogits is logits), xn and dxn are one f32 row or two staged copies of one
    // 16-bit row: each element is read before it is written.
    float* dxn = write == GradWrite::Assign ? s.out(dlogits, n * V, V) : s.inout(dlogits, n * V, V);
    if (fast)
      row_softmax_grad<true>(dxn, xn, V, lse[n], dl[n], write);
    else
      row_softmax_grad<false>(dxn, xn, V, lse[n], dl[n], write);
    if (shard.holds(tgt[n])) dxn[tgt[n] - shard.start] -= dl[n];
    s.done(dlogits, n * V, V, dxn);
  }
}

}  // namespace tessera::ops::cpu
