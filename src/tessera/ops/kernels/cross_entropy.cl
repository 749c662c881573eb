// Vocabulary-parallel softmax cross-entropy pieces (ops/cpu/cross_entropy.cpp). Legend: N
// rows, V local vocabulary columns, [vocab_start, vocab_start + V) this shard's ids.
// Targets were checked on the host. logits and dlogits may be 16-bit (widened to f32 as
// Megatron's .float()); every per-row tensor is f32.

__kernel void cross_entropy_max(__global float* row_max, ulong max_off, CONST_FLOATS(logits), long V) {
  const long n = get_global_id(0);
  float mx = -INFINITY;
  for (long v = 0; v < V; ++v) {
    const float x = LOAD(logits, n * V + v);
    mx = x > mx ? x : mx;
  }
  row_max[max_off + n] = mx;
}

// sum(exp(x - max)) in 32 fixed partial sums (element v to partial v % 32) added in order,
// as the CPU's row_sum_exp; target_logit = the target's logit if this shard holds it.
#define SUM_LANES 32
__kernel void cross_entropy_sums(__global float* sum_exp, ulong se_off, __global float* target_logit, ulong tl_off,
                                 CONST_FLOATS(logits), __global const int* targets, ulong tgt_off,
                                 __global const float* row_max, ulong max_off, long V, long vocab_start) {
  const long n = get_global_id(0), x = n * V;  // x: the row's first element
  const float m = row_max[max_off + n];
  float acc[SUM_LANES];
  for (int j = 0; j < SUM_LANES; ++j) acc[j] = 0.0f;
  long v = 0;
  for (; v + SUM_LANES <= V; v += SUM_LANES)
    for (int j = 0; j < SUM_LANES; ++j) acc[j] += exp_approx(LOAD(logits, x + v + j) - m);
  for (int j = 0; v + j < V; ++j) acc[j] += exp_approx(LOAD(logits, x + v + j) - m);
  float sum = 0.0f;
  for (int j = 0; j < SUM_LANES; ++j) sum += acc[j];
  sum_exp[se_off + n] = sum;
  const long tgt = targets[tgt_off + n];
  target_logit[tl_off + n] = tgt >= vocab_start && tgt - vocab_start < V ? LOAD(logits, x + tgt - vocab_start) : 0.0f;
}

__kernel void cross_entropy_finish(__global float* losses, ulong loss_off, __global float* logsumexp, ulong lse_off,
                                   __global const float* sum_exp, ulong se_off, __global const float* row_max,
                                   ulong max_off, __global const float* target_logit, ulong tl_off) {
  const long n = get_global_id(0);
  const float lse = row_max[max_off + n] + log(sum_exp[se_off + n]);
  logsumexp[lse_off + n] = lse;
  losses[loss_off + n] = lse - target_logit[tl_off + n];
}

// dlogits[n, v] (+)= exp(logits[n, v] - lse[n]) * dlosses[n], minus dlosses[n] in the
// target's column, in the CPU's order (the softmax term added, then the target's
// subtracted), rounded once; work-item (v, n). dlogits may be logits (assigning in place:
// the logit is read before the gradient is stored).
__kernel void cross_entropy_backward(FLOATS(dlogits), __global const float* dlosses, ulong dl_off,
                                     CONST_FLOATS(logits), __global const int* targets, ulong tgt_off,
                                     __global const float* logsumexp, ulong lse_off, long V, long vocab_start,
                                     int assign) {
  const long v = get_global_id(0), n = get_global_id(1), i = n * V + v;
  const float d = dlosses[dl_off + n];
  float g = (assign ? 0.0f : LOAD(dlogits, i)) + exp_approx(LOAD(logits, i) - logsumexp[lse_off + n]) * d;
  if (targets[tgt_off + n] - vocab_start == v) g -= d;
  STORE(dlogits, i, g);
}
