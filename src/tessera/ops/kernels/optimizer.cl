// Optimizer updates (ops/cpu/optimizer_updates.cpp), op for op like torch's single-tensor
// AdamW and SGD; the host computes the step's scalars in double and rounds them once.
// No contraction into FMAs: every operation rounds as written, as in the CPU build
// (optimizer_updates.cpp is compiled with -ffp-contract=off), so both backends give the
// same bits (with -cl-fp32-correctly-rounded-divide-sqrt for / and sqrt). param, m, v
// are the fp32 main parameters and Adam state; grad may be any float dtype.
// The multi-tensor kernels run the same element functions over a slab's chunk table
// (multi_tensor.cl), work-item (lane, chunk) taking every MT_LANES-th element of its chunk,
// with the step's scalars read from device memory.
#pragma OPENCL FP_CONTRACT OFF

// AdamW on one element: updates *m and *v, returns the new parameter value.
DEVICE_FN float adamw_element(float p, __global float* m, __global float* v, float gi, float decay, float w1,
                              int lerp_low, float w1c, float beta2, float w2, float step_size, float bc2_sqrt,
                              float eps) {
  float pi = p * decay;
  const float mo = *m;
  const float mi = lerp_low ? mo + w1 * (gi - mo) : gi - (gi - mo) * w1c;
  const float vi = *v * beta2 + w2 * (gi * gi);
  const float denom = sqrt(vi) / bc2_sqrt + eps;
  pi = pi - step_size * (mi / denom);
  *m = mi;
  *v = vi;
  return pi;
}

// SGD on one element (buf null: momentum 0, no buffer); returns the new parameter value.
DEVICE_FN float sgd_element(float p, __global float* buf, float gi, float lr, float momentum, float weight_decay,
                            int first) {
  if (!buf) return p - lr * (gi + weight_decay * p);
  const float d = weight_decay != 0.0f ? gi + weight_decay * p : gi;
  const float b = first ? d : *buf * momentum + d;
  *buf = b;
  return p - lr * b;
}

__kernel void adamw_update(__global float* param, ulong p_off, CONST_FLOATS(grad), __global float* m, ulong m_off,
                           __global float* v, ulong v_off, float decay, float w1,
                           int lerp_low, float w1c, float beta2, float w2, float step_size, float bc2_sqrt, float eps,
                           float grad_scale) {
  const long i = get_global_id(0);
  param[p_off + i] = adamw_element(param[p_off + i], m + m_off + i, v + v_off + i, LOAD(grad, i) * grad_scale, decay,
                                   w1, lerp_low, w1c, beta2, w2, step_size, bc2_sqrt, eps);
}

// momentum == 0: p -= lr * (g + wd p), no buffer (buf is null).
__kernel void sgd_update(__global float* param, ulong p_off, CONST_FLOATS(grad), __global float* buf, ulong buf_off,
                         float lr, float momentum, float weight_decay, int first,
                         float grad_scale) {
  const long i = get_global_id(0);
  param[p_off + i] = sgd_element(param[p_off + i], buf ? buf + buf_off + i : buf, LOAD(grad, i) * grad_scale, lr,
                                 momentum, weight_decay, first);
}

// param (the 16-bit copy, or absent) = main, rounded once (ops.h convert).
#define MT_COPY_TO_PARAM(row, i, value) \
  if (param) STORE(param, (row)[CHUNK_PARAM] + (i), (value))

__kernel void multi_tensor_adamw(__global float* mains, ulong mains_off, FLOATS(param), __global const float* grad,
                                 ulong grad_off, __global float* m, ulong m_off, __global float* v, ulong v_off,
                                 __global const long* chunks, ulong chunks_off, __global const float* s, ulong s_off,
                                 float w1, int lerp_low, float w1c, float beta2, float w2, float eps) {
  const long lane = get_global_id(0), c = get_global_id(1);
  __global const long* row = chunks + chunks_off + c * CHUNK_COLUMNS;
  s += s_off;
  const float decay = row[CHUNK_DECAY] ? s[SCALAR_ADAM_DECAY] : 1.0f;  // adamw_update's 1 - lr * 0
  const float step_size = s[SCALAR_ADAM_STEP_SIZE], bc2_sqrt = s[SCALAR_ADAM_BC2_SQRT], scale = s[SCALAR_GRAD_SCALE];
  __global float* p = mains + mains_off + row[CHUNK_MAIN];
  __global const float* g = grad + grad_off + row[CHUNK_GRAD];
  const long state = row[CHUNK_STATE];
  for (long i = lane; i < row[CHUNK_NUMEL]; i += MT_LANES) {
    const float pi = adamw_element(p[i], m + m_off + state + i, v + v_off + state + i, g[i] * scale, decay, w1,
                                   lerp_low, w1c, beta2, w2, step_size, bc2_sqrt, eps);
    p[i] = pi;
    MT_COPY_TO_PARAM(row, i, pi);
  }
}

// momentum == 0: buf is null.
__kernel void multi_tensor_sgd(__global float* mains, ulong mains_off, FLOATS(param), __global const float* grad,
                               ulong grad_off, __global float* buf, ulong buf_off, __global const long* chunks,
                               ulong chunks_off, __global const float* s, ulong s_off, float momentum) {
  const long lane = get_global_id(0), c = get_global_id(1);
  __global const long* row = chunks + chunks_off + c * CHUNK_COLUMNS;
  s += s_off;
  const float weight_decay = row[CHUNK_DECAY] ? s[SCALAR_WEIGHT_DECAY] : 0.0f;
  const float lr = s[SCALAR_LR], scale = s[SCALAR_GRAD_SCALE];
  const int first = s[SCALAR_SGD_FIRST] != 0.0f;
  __global float* p = mains + mains_off + row[CHUNK_MAIN];
  __global const float* g = grad + grad_off + row[CHUNK_GRAD];
  __global float* b = buf ? buf + buf_off + row[CHUNK_STATE] : buf;
  for (long i = lane; i < row[CHUNK_NUMEL]; i += MT_LANES) {
    const float pi = sgd_element(p[i], b ? b + i : b, g[i] * scale, lr, momentum, weight_decay, first);
    p[i] = pi;
    MT_COPY_TO_PARAM(row, i, pi);
  }
}
