// Optimizer updates (ops/cpu/optimizer_updates.cpp), op for op like torch's single-tensor
// AdamW and SGD; the host computes the step's scalars in double and rounds them once.
// No contraction into FMAs: every operation rounds as written, as in the CPU build
// (optimizer_updates.cpp is compiled with -ffp-contract=off), so both backends give the
// same bits (with -cl-fp32-correctly-rounded-divide-sqrt for / and sqrt). param, m, v
// are the fp32 main parameters and Adam state; grad may be any float dtype.
#pragma OPENCL FP_CONTRACT OFF

__kernel void adamw_update(__global float* param, ulong p_off, CONST_FLOATS(grad), __global float* m, ulong m_off,
                           __global float* v, ulong v_off, float decay, float w1,
                           int lerp_low, float w1c, float beta2, float w2, float step_size, float bc2_sqrt, float eps,
                           float grad_scale) {
  const long i = get_global_id(0);
  const float gi = LOAD(grad, i) * grad_scale;
  float pi = param[p_off + i] * decay;
  const float mo = m[m_off + i];
  const float mi = lerp_low ? mo + w1 * (gi - mo) : gi - (gi - mo) * w1c;
  const float vi = v[v_off + i] * beta2 + w2 * (gi * gi);
  const float denom = sqrt(vi) / bc2_sqrt + eps;
  pi = pi - step_size * (mi / denom);
  param[p_off + i] = pi;
  m[m_off + i] = mi;
  v[v_off + i] = vi;
}

// momentum == 0: p -= lr * (g + wd p), no buffer (buf is null).
__kernel void sgd_update(__global float* param, ulong p_off, CONST_FLOATS(grad), __global float* buf, ulong buf_off,
                         float lr, float momentum, float weight_decay, int first,
                         float grad_scale) {
  const long i = get_global_id(0);
  const float gi = LOAD(grad, i) * grad_scale;
  const float p = param[p_off + i];
  if (!buf) {
    param[p_off + i] = p - lr * (gi + weight_decay * p);
    return;
  }
  const float d = weight_decay != 0.0f ? gi + weight_decay * p : gi;
  const float b = first ? d : buf[buf_off + i] * momentum + d;
  buf[buf_off + i] = b;
  param[p_off + i] = p - lr * b;
}
