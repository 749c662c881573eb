// Softmax cross-entropy over the whole (padded) vocabulary, one row per token.
// Legend: N rows (= B*T), V vocabulary (50304 for GPT-2). logits, dlogits: [N,V];
// losses, dlosses: [N]; targets: i32 [N].
// A row of logits is 200 KB, so the cost is memory passes and exps: the forward makes one
// pass for the max and one for sum(exp(x - max)); the backward makes one pass when it is
// given the losses (logsumexp = loss + logit of the target), otherwise one fused
// max-and-sum pass first. exp_approx keeps those passes vectorised.
#include <cmath>
#include <limits>
#include <string>

#include "tessera/ops/cpu/cpu_ops.h"
#include "tessera/ops/cpu/fast_math.h"

namespace tessera::ops::cpu {
namespace {

void check_shapes(const Tensor& logits, const Tensor& targets, const Tensor& per_row, const char* what) {
  TESSERA_CHECK(logits.ndim() >= 2 && targets.numel() * logits.dim(-1) == logits.numel() &&
                    per_row.numel() == targets.numel(),
                std::string(what) + ": logits " + shape_str(logits.shape) + ", targets " + shape_str(targets.shape) +
                    ", per-row " + shape_str(per_row.shape));
}

int64_t checked_target(const int32_t* targets, int64_t n, int64_t V) {
  const int64_t t = targets[n];
  TESSERA_CHECK(t >= 0 && t < V, "cross-entropy target " + std::to_string(t) + " of row " + std::to_string(n) +
                                     " outside [0, " + std::to_string(V) + ")");
  return t;
}

// log(sum(exp(x))) of one row, as max + log(sum(exp(x - max))).
float row_logsumexp(const float* x, int64_t V) {
  float mx = -std::numeric_limits<float>::infinity();
#pragma omp simd reduction(max : mx)
  for (int64_t v = 0; v < V; ++v) mx = x[v] > mx ? x[v] : mx;
  float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
  for (int64_t v = 0; v < V; ++v) sum += exp_approx(x[v] - mx);
  return mx + std::log(sum);
}

// dlogits[n,:] += (exp(x - lse) - onehot(target)) * dloss, one pass.
void row_backward(float* dx, const float* x, int64_t V, float lse, int64_t target, float dloss) {
#pragma omp simd
  for (int64_t v = 0; v < V; ++v) dx[v] += exp_approx(x[v] - lse) * dloss;
  dx[target] -= dloss;
}

}  // namespace

void cross_entropy_forward(Tensor losses, Tensor logits, Tensor targets) {
  check_shapes(logits, targets, losses, "cross_entropy_forward");
  const int64_t V = logits.dim(-1), N = targets.numel();
  const float* x = logits.f32();
  const int32_t* tgt = targets.i32();
  float* loss = losses.f32();
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < N; ++n) {
    const float* xn = x + n * V;
    loss[n] = row_logsumexp(xn, V) - xn[checked_target(tgt, n, V)];
  }
}

void cross_entropy_backward(Tensor dlogits, Tensor dlosses, Tensor logits, Tensor targets) {
  check_shapes(logits, targets, dlosses, "cross_entropy_backward");
  TESSERA_CHECK(dlogits.numel() == logits.numel(), "cross_entropy_backward: dlogits " + shape_str(dlogits.shape));
  const int64_t V = logits.dim(-1), N = targets.numel();
  const float* x = logits.f32();
  const int32_t* tgt = targets.i32();
  const float* dl = dlosses.f32();
  float* dx = dlogits.f32();
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < N; ++n) {
    const float* xn = x + n * V;
    row_backward(dx + n * V, xn, V, row_logsumexp(xn, V), checked_target(tgt, n, V), dl[n]);
  }
}

void cross_entropy_backward(Tensor dlogits, Tensor dlosses, Tensor logits, Tensor targets, Tensor losses) {
  check_shapes(logits, targets, dlosses, "cross_entropy_backward");
  check_shapes(logits, targets, losses, "cross_entropy_backward");
  TESSERA_CHECK(dlogits.numel() == logits.numel(), "cross_entropy_backward: dlogits " + shape_str(dlogits.shape));
  const int64_t V = logits.dim(-1), N = targets.numel();
  const float* x = logits.f32();
  const int32_t* tgt = targets.i32();
  const float* dl = dlosses.f32();
  const float* loss = losses.f32();
  float* dx = dlogits.f32();
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < N; ++n) {
    const float* xn = x + n * V;
    const int64_t t = checked_target(tgt, n, V);
    // The forward's loss is lse - x[t], so the saved loss gives lse back without a pass.
    row_backward(dx + n * V, xn, V, loss[n] + xn[t], t, dl[n]);
  }
}

}  // namespace tessera::ops::cpu
