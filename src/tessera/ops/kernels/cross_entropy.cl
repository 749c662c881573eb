// Vocabulary-parallel softmax cross-entropy pieces (ops/cpu/cross_entropy.cpp). Legend: N
// rows, V local vocabulary columns, [vocab_start, vocab_start + V) this shard's ids.
// Targets were checked on the host.

__kernel void cross_entropy_max(__global float* row_max, ulong max_off, __global const float* logits, ulong x_off,
                                long V) {
  const long n = get_global_id(0);
  __global const float* x = logits + x_off + n * V;
  float mx = -INFINITY;
  for (long v = 0; v < V; ++v) mx = x[v] > mx ? x[v] : mx;
  row_max[max_off + n] = mx;
}

// sum(exp(x - max)) in 32 fixed partial sums (element v to partial v % 32) added in order,
// as the CPU's row_sum_exp; target_logit = the target's logit if this shard holds it.
#define SUM_LANES 32
__kernel void cross_entropy_sums(__global float* sum_exp, ulong se_off, __global float* target_logit, ulong tl_off,
                                 __global const float* logits, ulong x_off, __global const int* targets,
                                 ulong tgt_off, __global const float* row_max, ulong max_off, long V,
                                 long vocab_start) {
  const long n = get_global_id(0);
  __global const float* x = logits + x_off + n * V;
  const float m = row_max[max_off + n];
  float acc[SUM_LANES];
  for (int j = 0; j < SUM_LANES; ++j) acc[j] = 0.0f;
  long v = 0;
  for (; v + SUM_LANES <= V; v += SUM_LANES)
    for (int j = 0; j < SUM_LANES; ++j) acc[j] += exp_approx(x[v + j] - m);
  for (int j = 0; v + j < V; ++j) acc[j] += exp_approx(x[v + j] - m);
  float sum = 0.0f;
  for (int j = 0; j < SUM_LANES; ++j) sum += acc[j];
  sum_exp[se_off + n] = sum;
  const long tgt = targets[tgt_off + n];
  target_logit[tl_off + n] = tgt >= vocab_start && tgt - vocab_start < V ? x[tgt - vocab_start] : 0.0f;
}

__kernel void cross_entropy_finish(__global float* losses, ulong loss_off, __global float* logsumexp, ulong lse_off,
                                   __global const float* sum_exp, ulong se_off, __global const float* row_max,
                                   ulong max_off, __global const float* target_logit, ulong tl_off) {
  const long n = get_global_id(0);
  const float lse = row_max[max_off + n] + log(sum_exp[se_off + n]);
  logsumexp[lse_off + n] = lse;
  losses[loss_off + n] = lse - target_logit[tl_off + n];
}

// dlogits[n, v] += exp(logits[n, v] - lse[n]) * dlosses[n]; work-item (v, n).
__kernel void cross_entropy_backward_softmax(__global float* dlogits, ulong dx_off, __global const float* dlosses,
                                             ulong dl_off, __global const float* logits, ulong x_off,
                                             __global const float* logsumexp, ulong lse_off, long V) {
  const long v = get_global_id(0), n = get_global_id(1);
  dlogits[dx_off + n * V + v] += exp_approx(logits[x_off + n * V + v] - logsumexp[lse_off + n]) * dlosses[dl_off + n];
}

// Then the target's column: dlogits[n, target - vocab_start] -= dlosses[n]; one work-item
// per row (after the softmax part, as on the CPU).
__kernel void cross_entropy_backward_target(__global float* dlogits, ulong dx_off, __global const float* dlosses,
                                            ulong dl_off, __global const int* targets, ulong tgt_off, long V,
                                            long vocab_start) {
  const long n = get_global_id(0);
  const long tgt = targets[tgt_off + n];
  if (tgt >= vocab_start && tgt - vocab_start < V) dlogits[dx_off + n * V + tgt - vocab_start] -= dlosses[dl_off + n];
}
