// Optimizer updates (ops/cpu/optimizer_updates.cpp), op for op like torch's single-tensor
// AdamW and SGD; the host computes the step's scalars in double and rounds them once.
// No contraction into FMAs: every operation rounds as written, as in the CPU build
// (optimizer_updates.cpp is compiled with -ffp-contract=off), so both backends give the
// same bits (with -cl-fp32-correctly-rounded-divide-sqrt for / and sqrt). param, m, v
// are the fp32 main parameters and Adam state; grad may be any float dtype.
// The multi-tensor kernels run the same element functions over a slab's chunk table
// (multi_tensor.cl), work-item (i, c) on element i of chunk c (none past the chunk's end:
// the NDRange is 65536 x chunks), with the step's scalars read from device memory. One
// element per work-item, as the per-tensor kernels (a strided loop per work-item ran 1.8x
// slower still on PoCL; docs/benchmarks.md has what remains).
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
  const long i = get_global_id(0), c = get_global_id(1);
  __global const long* row = chunks + chunks_off + c * CHUNK_COLUMNS;
  if (i >= row[CHUNK_NUMEL]) return;
  s += s_off;
  const float decay = row[CHUNK_DECAY] ? s[SCALAR_ADAM_DECAY] : 1.0f;  // adamw_update's 1 - lr * 0
  const long p = mains_off + row[CHUNK_MAIN] + i, state = row[CHUNK_STATE] + i;
  const float pi = adamw_element(mains[p], m + m_off + state, v + v_off + state,
                                 grad[grad_off + row[CHUNK_GRAD] + i] * s[SCALAR_GRAD_SCALE], decay, w1, lerp_low,
                                 w1c, beta2, w2, s[SCALAR_ADAM_STEP_SIZE], s[SCALAR_ADAM_BC2_SQRT], eps);
  mains[p] = pi;
  MT_COPY_TO_PARAM(row, i, pi);
}

// momentum == 0: buf is null.
__kernel void multi_tensor_sgd(__global float* mains, ulong mains_off, FLOATS(param), __global const float* grad,
                               ulong grad_off, __global float* buf, ulong buf_off, __global const long* chunks,
                               ulong chunks_off, __global const float* s, ulong s_off, float momentum) {
  const long i = get_global_id(0), c = get_global_id(1);
  __global const long* row = chunks + chunks_off + c * CHUNK_COLUMNS;
  if (i >= row[CHUNK_NUMEL]) return;
  s += s_off;
  const float weight_decay = row[CHUNK_DECAY] ? s[SCALAR_WEIGHT_DECAY] : 0.0f;
  const long p = mains_off + row[CHUNK_MAIN] + i;
  const float pi = sgd_element(mains[p], buf ? buf + buf_off + row[CHUNK_STATE] + i : buf,
                               grad[grad_off + row[CHUNK_GRAD] + i] * s[SCALAR_GRAD_SCALE], s[SCALAR_LR], momentum,
                               weight_decay, s[SCALAR_SGD_FIRST] != 0.0f);
  mains[p] = pi;
  MT_COPY_TO_PARAM(row, i, pi);
}
