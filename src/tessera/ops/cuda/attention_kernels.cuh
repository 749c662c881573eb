// The CUDA-only kernels of causal self-attention by GEMMs (ops/cuda/attention.cpp, after
// llm.c's attention_forward / attention_backward in llmc/attention.cuh): cuBLASLt multiplies
// the matrices, these kernels move heads in and out of the GEMMs' layout and run the causal
// softmax, its dropout and its backward, a row of the [T,T] scores per thread block.
// Included by kernels.cu after the shared sources (dtype.cl's FLOATS / LOAD / STORE,
// common.cl's exp_approx and DROPOUT_FACTOR), whose index logic attention.cl's kernels are
// the tested reference of, and after block_reduce.cuh.
//
// Legend as attention.cl: B batch, T sequence, NH heads, HD head dim, BH = B*NH. A row of
// qkv [B,T,NH*3*HD] holds per head h [q;k;v] at h*3*HD; out and dout [B,T,NH*HD] head h at
// h*HD. The GEMMs' layout ("blocks"): f32 [parts][BH][T][HD], every head's q (or k, v, dq, ...)
// one contiguous row-major [T,HD] matrix, bh = b*NH + h. Scores, probabilities and their
// gradients: f32 [BH][T][T], row (bh, t) at (bh*T + t)*T, as att's.

// Work-item (column c of a row of x [B,T,NH*parts*HD], row = b*T + t): c = (h*parts + part)*HD
// + i, so parts = 3 reads a qkv row (q, k, v of head h) and parts = 1 an out row.
DEVICE_FN long attention_block_index(long c, long row, long B, long T, long NH, long parts, long HD) {
  const long b = row / T, t = row % T, h = c / (parts * HD), part = c / HD % parts, i = c % HD;
  return (((part * B + b) * NH + h) * T + t) * HD + i;
}

// blocks = x, widened to f32 (exact).
__kernel void attention_heads_to_blocks(__global float* blocks, CONST_FLOATS(x), long B, long T, long NH, long parts,
                                        long HD) {
  const long c = get_global_id(0), row = get_global_id(1);
  blocks[attention_block_index(c, row, B, T, NH, parts, HD)] = LOAD(x, row * NH * parts * HD + c);
}

// x = blocks, or x += blocks when accumulate (a gradient: read, add in f32), rounded once
// into x's dtype.
__kernel void attention_blocks_to_heads(FLOATS(x), __global const float* blocks, long B, long T, long NH, long parts,
                                        long HD, int accumulate) {
  const long c = get_global_id(0), row = get_global_id(1), j = row * NH * parts * HD + c;
  const float v = blocks[attention_block_index(c, row, B, T, NH, parts, HD)];
  STORE(x, j, accumulate ? LOAD(x, j) + v : v);
}

// Thread block (query t = blockIdx.x, bh = get_global_id(1)); launched with global0 =
// blockDim.x * T. scores: q_t . k_t2 of the row (from the GEMM), in place to the row of the
// dropped-out f32 probabilities the output GEMM multiplies with v: attention.cl's
// attention_forward, step for step: s = score * scale, the max over keys t2 <= t,
// e = exp_approx(s - max), a = e * (1 / sum e), att = a rounded once (0 above the
// diagonal), then a * factor of dropout element (h*T + t)*T + t2. Above the diagonal the
// row becomes 0, so the GEMM's sum over all T keys is the causal one.
__kernel void attention_softmax_forward(__global float* scores, FLOATS(att), long T, long NH, float scale,
                                        DROPOUT_PARAMS) {
  const long t = blockIdx.x, bh = get_global_id(1), b = bh / NH, h = bh % NH;
  const long row = (bh * T + t) * T;
  __global float* s = scores + row;
  float mx = -INFINITY;
  for (long t2 = threadIdx.x; t2 <= t; t2 += blockDim.x) {
    s[t2] *= scale;
    mx = fmax(mx, s[t2]);
  }
  mx = block_reduce(mx, true);
  float sum = 0.0f;
  for (long t2 = threadIdx.x; t2 <= t; t2 += blockDim.x) {
    s[t2] = exp_approx(s[t2] - mx);
    sum += s[t2];
  }
  const float inv = 1.0f / block_reduce(sum, false);
  for (long t2 = threadIdx.x; t2 < T; t2 += blockDim.x) {
    const float a = t2 <= t ? s[t2] * inv : 0.0f;
    STORE(att, row + t2, a);
    s[t2] = drop_p > 0.0f && t2 <= t ? a * DROPOUT_FACTOR(b, (ulong)((h * T + t) * T + t2)) : a;
  }
}

// Work-item (e = t*T + t2, bh): the dropped-out probabilities a' = att * factor (att as
// saved; 0 above the diagonal stays 0) that the dv GEMM multiplies with dout.
__kernel void attention_dropped_probabilities(__global float* dropped, CONST_FLOATS(att), long T, long NH,
                                              DROPOUT_PARAMS) {
  const long e = get_global_id(0), bh = get_global_id(1), b = bh / NH, h = bh % NH;
  const float a = LOAD(att, bh * T * T + e);
  // (h*T + t)*T + t2 = h*T*T + e
  dropped[bh * T * T + e] = drop_p > 0.0f ? a * DROPOUT_FACTOR(b, (ulong)(h * T * T + e)) : a;
}

// Thread block (query t = blockIdx.x, bh), as attention_softmax_forward. dscores: the row
// of dout_t . v_t2 (from the GEMM), in place to the score gradients the dq and dk GEMMs
// multiply with: attention.cl's attention_backward_rows, step for step: gv = dot * factor,
// ada = sum over t2 <= t of a * gv, ds = a * (gv - ada) * scale (a as saved), 0 above the
// diagonal.
__kernel void attention_softmax_backward(__global float* dscores, CONST_FLOATS(att), long T, long NH, float scale,
                                         DROPOUT_PARAMS) {
  const long t = blockIdx.x, bh = get_global_id(1), b = bh / NH, h = bh % NH;
  const long row = (bh * T + t) * T;
  __global float* ds = dscores + row;
  float ada = 0.0f;
  for (long t2 = threadIdx.x; t2 <= t; t2 += blockDim.x) {
    if (drop_p > 0.0f) ds[t2] *= DROPOUT_FACTOR(b, (ulong)((h * T + t) * T + t2));
    ada += LOAD(att, row + t2) * ds[t2];
  }
  ada = block_reduce(ada, false);
  for (long t2 = threadIdx.x; t2 < T; t2 += blockDim.x)
    ds[t2] = t2 <= t ? LOAD(att, row + t2) * (ds[t2] - ada) * scale : 0.0f;
}
