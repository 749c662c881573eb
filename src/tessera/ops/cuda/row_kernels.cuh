// CUDA-only kernels of LayerNorm and RMSNorm, the cross-entropy row statistics and the
// column sums (bias gradients), replacing on CUDA the shared kernels of layernorm.cl,
// cross_entropy.cl and elementwise.cl that give one work-item a whole row or a whole column
// (uncoalesced, and too few work-items for a GPU). Each keeps its shared kernel's arguments and
// arithmetic (the index logic is checked against it by tests/unit/ops/backend_ops_test.cpp);
// only which thread adds what changes. Included by kernels.cu after the shared sources
// (dtype.cl's FLOATS / LOAD / STORE / ADD_TO, common.cl's exp_approx) and block_reduce.cuh.

// ---- LayerNorm and RMSNorm: a row per thread block -------------------------------------
// Thread block n = blockIdx.x over row n of [N, C] (the host launches global0 = blockDim.x
// * N, layernorm.cpp), its threads striding over the row's columns c = threadIdx.x + k *
// blockDim.x, the row sums combined by block_reduce.

// layernorm.cl's layernorm_forward: mean, then the variance about it, then out.
__kernel void layernorm_forward_rows(FLOATS(out), __global float* mean, ulong mean_off, __global float* rstd,
                                     ulong rstd_off, CONST_FLOATS(inp), CONST_FLOATS(weight), CONST_FLOATS(bias),
                                     long C, float eps) {
  const long n = blockIdx.x, x = n * C;  // x: the row's first element
  float sum = 0.0f;
  for (long c = threadIdx.x; c < C; c += blockDim.x) sum += LOAD(inp, x + c);
  const float mu = block_reduce(sum, false) / (float)C;
  float sq = 0.0f;
  for (long c = threadIdx.x; c < C; c += blockDim.x) {
    const float d = LOAD(inp, x + c) - mu;
    sq += d * d;
  }
  const float rs = 1.0f / sqrt(block_reduce(sq, false) / (float)C + eps);
  for (long c = threadIdx.x; c < C; c += blockDim.x) {
    const float v = (LOAD(inp, x + c) - mu) * rs * LOAD(weight, c);
    STORE(out, x + c, bias ? v + LOAD(bias, c) : v);
  }
  if (threadIdx.x == 0 && mean) mean[mean_off + n] = mu;
  if (threadIdx.x == 0 && rstd) rstd[rstd_off + n] = rs;
}

// layernorm.cl's layernorm_backward_input: dinp (+)= rstd * (g - mean(g) - xhat *
// mean(g * xhat)), g = dout * weight.
__kernel void layernorm_backward_input_rows(FLOATS(dinp), CONST_FLOATS(dout), CONST_FLOATS(inp), CONST_FLOATS(weight),
                                            __global const float* mean, ulong mean_off, __global const float* rstd,
                                            ulong rstd_off, long C, int assign) {
  const long n = blockIdx.x, x = n * C;  // x: the row's first element
  const float m = mean[mean_off + n], r = rstd[rstd_off + n];
  float g_sum = 0.0f, gx_sum = 0.0f;
  for (long c = threadIdx.x; c < C; c += blockDim.x) {
    const float g = LOAD(dout, x + c) * LOAD(weight, c);
    g_sum += g;
    gx_sum += g * ((LOAD(inp, x + c) - m) * r);
  }
  const float g_mean = block_reduce(g_sum, false) / (float)C;
  const float gx_mean = block_reduce(gx_sum, false) / (float)C;
  for (long c = threadIdx.x; c < C; c += blockDim.x) {
    const float xhat = (LOAD(inp, x + c) - m) * r;
    GRAD_TO(dinp, x + c, (LOAD(dout, x + c) * LOAD(weight, c) - g_mean - xhat * gx_mean) * r, assign);
  }
}

// layernorm.cl's rmsnorm_forward: out = inp * rstd * weight, rstd = 1 / sqrt(mean(inp^2)
// + eps).
__kernel void rmsnorm_forward_rows(FLOATS(out), __global float* rstd, ulong rstd_off, CONST_FLOATS(inp),
                                   CONST_FLOATS(weight), long C, float eps) {
  const long n = blockIdx.x, x = n * C;  // x: the row's first element
  float sq = 0.0f;
  for (long c = threadIdx.x; c < C; c += blockDim.x) {
    const float v = LOAD(inp, x + c);
    sq += v * v;
  }
  const float rs = 1.0f / sqrt(block_reduce(sq, false) / (float)C + eps);
  for (long c = threadIdx.x; c < C; c += blockDim.x) STORE(out, x + c, LOAD(inp, x + c) * rs * LOAD(weight, c));
  if (threadIdx.x == 0 && rstd) rstd[rstd_off + n] = rs;
}

// layernorm.cl's rmsnorm_backward_input: dinp (+)= rstd * (g - xhat * mean(g * xhat)),
// g = dout * weight, xhat = inp * rstd.
__kernel void rmsnorm_backward_input_rows(FLOATS(dinp), CONST_FLOATS(dout), CONST_FLOATS(inp), CONST_FLOATS(weight),
                                          __global const float* rstd, ulong rstd_off, long C, int assign) {
  const long n = blockIdx.x, x = n * C;  // x: the row's first element
  const float r = rstd[rstd_off + n];
  float gx_sum = 0.0f;
  for (long c = threadIdx.x; c < C; c += blockDim.x)
    gx_sum += LOAD(dout, x + c) * LOAD(weight, c) * (LOAD(inp, x + c) * r);
  const float gx_mean = block_reduce(gx_sum, false) / (float)C;
  for (long c = threadIdx.x; c < C; c += blockDim.x)
    GRAD_TO(dinp, x + c, (LOAD(dout, x + c) * LOAD(weight, c) - LOAD(inp, x + c) * r * gx_mean) * r, assign);
}

// ---- cross-entropy row statistics: a row per warp --------------------------------------
// Row n = get_global_id(0) / 32 of logits [N, V], lane j = get_global_id(0) % 32 (the host
// launches global0 = 32 * N, cross_entropy.cpp; blocks are whole warps, so a warp is one
// row). Lane j reads columns j, j + 32, j + 64, ... in order: cross_entropy.cl's partial
// sum j, so the sums are the CPU's (ops/cpu/cross_entropy.cpp's row_sum_exp) term for term.
#define ROW_LANES 32

// cross_entropy.cl's cross_entropy_max.
__kernel void cross_entropy_max_rows(__global float* row_max, ulong max_off, CONST_FLOATS(logits), long V) {
  const long n = get_global_id(0) / ROW_LANES;
  const int lane = (int)(get_global_id(0) % ROW_LANES);
  float mx = -INFINITY;
  for (long v = lane; v < V; v += ROW_LANES) {
    const float x = LOAD(logits, n * V + v);
    mx = x > mx ? x : mx;
  }
  for (int o = ROW_LANES / 2; o > 0; o /= 2) {
    const float other = __shfl_xor_sync(0xffffffffu, mx, o);
    mx = other > mx ? other : mx;
  }
  if (lane == 0) row_max[max_off + n] = mx;
}

// cross_entropy.cl's cross_entropy_sums: lane j holds partial sum j; the 32 are added in
// order 0..31 (every lane adds them, lane 0 stores).
__kernel void cross_entropy_sums_rows(__global float* sum_exp, ulong se_off, __global float* target_logit,
                                      ulong tl_off, CONST_FLOATS(logits), __global const int* targets, ulong tgt_off,
                                      __global const float* row_max, ulong max_off, long V, long vocab_start) {
  const long n = get_global_id(0) / ROW_LANES, x = n * V;  // x: the row's first element
  const int lane = (int)(get_global_id(0) % ROW_LANES);
  const float m = row_max[max_off + n];
  float acc = 0.0f;
  for (long v = lane; v < V; v += ROW_LANES) acc += exp_approx(LOAD(logits, x + v) - m);
  float sum = 0.0f;
  for (int j = 0; j < ROW_LANES; ++j) sum += __shfl_sync(0xffffffffu, acc, j);
  if (lane != 0) return;
  sum_exp[se_off + n] = sum;
  const long tgt = targets[tgt_off + n];
  target_logit[tl_off + n] = tgt >= vocab_start && tgt - vocab_start < V ? LOAD(logits, x + tgt - vocab_start) : 0.0f;
}

// ---- column sums in two passes ---------------------------------------------------------
// Deterministic (a fixed order, no atomics): pass 1, work-item (column c, block b) over
// (C, ceil(N / rows) blocks), adds rows [b * rows, min(N, (b + 1) * rows)) of column c in
// row order into partials [blocks, C] f32 at b * C + c (a warp reads 32 adjacent columns of
// a row: coalesced); pass 2 (column_partials_add) adds each column's partials in block
// order. With one block (N <= rows) the sum is the shared kernel's, bit for bit.

// elementwise.cl's column_sums, pass 1.
__kernel void column_sums_partials(__global float* partials, CONST_FLOATS(dy), long N, long OC, long rows) {
  const long o = get_global_id(0), b = get_global_id(1), end = min(N, (b + 1) * rows);
  float acc = 0.0f;
  for (long n = b * rows; n < end; ++n) acc += LOAD(dy, n * OC + o);
  partials[b * OC + o] = acc;
}

// layernorm.cl's layernorm_backward_params, pass 1: the dweight partials at partials_w,
// dbias's at partials_b.
__kernel void layernorm_backward_params_partials(__global float* partials_w, __global float* partials_b,
                                                 CONST_FLOATS(dout), CONST_FLOATS(inp), __global const float* mean,
                                                 ulong mean_off, __global const float* rstd, ulong rstd_off, long C,
                                                 long N, long rows) {
  const long c = get_global_id(0), b = get_global_id(1), end = min(N, (b + 1) * rows);
  float acc_w = 0.0f, acc_b = 0.0f;
  for (long n = b * rows; n < end; ++n) {
    const float dy = LOAD(dout, n * C + c);
    acc_w += dy * ((LOAD(inp, n * C + c) - mean[mean_off + n]) * rstd[rstd_off + n]);
    acc_b += dy;
  }
  partials_w[b * C + c] = acc_w;
  partials_b[b * C + c] = acc_b;
}

// layernorm.cl's rmsnorm_backward_weight, pass 1.
__kernel void rmsnorm_backward_weight_partials(__global float* partials, CONST_FLOATS(dout), CONST_FLOATS(inp),
                                               __global const float* rstd, ulong rstd_off, long C, long N,
                                               long rows) {
  const long c = get_global_id(0), b = get_global_id(1), end = min(N, (b + 1) * rows);
  float acc = 0.0f;
  for (long n = b * rows; n < end; ++n) acc += LOAD(dout, n * C + c) * (LOAD(inp, n * C + c) * rstd[rstd_off + n]);
  partials[b * C + c] = acc;
}

// Pass 2, work-item c: out[c] (+)= partials[0 * C + c] + partials[1 * C + c] + ... in block
// order (GRAD_TO: added in f32, or to 0 with assign, rounded once into out's dtype).
__kernel void column_partials_add(FLOATS(out), __global const float* partials, long C, long blocks, int assign) {
  const long c = get_global_id(0);
  float acc = partials[c];
  for (long b = 1; b < blocks; ++b) acc += partials[b * C + c];
  GRAD_TO(out, c, acc, assign);
}
