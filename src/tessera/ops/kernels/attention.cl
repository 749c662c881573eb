// Causal self-attention (ops/cpu/attention.cpp). Legend: B batch, T sequence, NH heads,
// HD head dim (at most MAX_HD, checked on the host), C3 = 3*NH*HD (qkv row), CO = NH*HD.
// Per head h of a qkv row: q at h*3*HD, k at +HD, v at +2*HD. att [B,NH,T,T] keeps the
// softmax probabilities before dropout, zeros above the diagonal.
#define MAX_HD 256

// One work-item per (query t, bh = b*NH + h). The probabilities row doubles as the score
// buffer.
__kernel void attention_forward(__global float* out, ulong out_off, __global float* att, ulong att_off,
                                __global const float* qkv, ulong qkv_off, long T, long NH, long HD, float scale,
                                DROPOUT_PARAMS) {
  const long t = get_global_id(0), bh = get_global_id(1);
  const long b = bh / NH, h = bh % NH, C3 = 3 * NH * HD, CO = NH * HD;
  __global const float* base = qkv + qkv_off + b * T * C3 + h * 3 * HD;
  __global const float* q = base + t * C3;
  __global float* a = att + att_off + (bh * T + t) * T;
  float mx = -INFINITY;
  for (long t2 = 0; t2 <= t; ++t2) {
    __global const float* k = base + t2 * C3 + HD;
    float s = 0.0f;
    for (long i = 0; i < HD; ++i) s += q[i] * k[i];
    s *= scale;
    a[t2] = s;
    mx = fmax(mx, s);
  }
  float sum = 0.0f;
  for (long t2 = 0; t2 <= t; ++t2) {
    const float e = exp_approx(a[t2] - mx);
    a[t2] = e;
    sum += e;
  }
  const float inv = 1.0f / sum;
  for (long t2 = 0; t2 < T; ++t2) a[t2] = t2 <= t ? a[t2] * inv : 0.0f;
  // out_t = sum over keys of a[t2] * dropout factor * v_t2; the dropout element of
  // (h, t, t2) in the sample's full [heads, T, T] is (h*T + t)*T + t2 (+ element_offset).
  float acc[MAX_HD];
  for (long i = 0; i < HD; ++i) acc[i] = 0.0f;
  for (long t2 = 0; t2 <= t; ++t2) {
    float w = a[t2];
    if (drop_p > 0.0f) w *= DROPOUT_FACTOR(b, (ulong)((h * T + t) * T + t2));
    __global const float* v = base + t2 * C3 + 2 * HD;
    for (long i = 0; i < HD; ++i) acc[i] += w * v[i];
  }
  __global float* y = out + out_off + (b * T + t) * CO + h * HD;
  for (long i = 0; i < HD; ++i) y[i] = acc[i];
}

// Backward, by query rows: d a[t2] = (dout_t . v_t2) * factor, the softmax backward to
// score gradients ds (kept in scratch, times the 1/sqrt(HD) of the scores), then
// dq_t += sum_t2 ds[t2] k_t2. One work-item per (t, bh).
__kernel void attention_backward_rows(__global float* dqkv, ulong dqkv_off, __global float* scratch,
                                      ulong scratch_off, __global const float* dout, ulong dout_off,
                                      __global const float* qkv, ulong qkv_off, __global const float* att,
                                      ulong att_off, long T, long NH, long HD, float scale, DROPOUT_PARAMS) {
  const long t = get_global_id(0), bh = get_global_id(1);
  const long b = bh / NH, h = bh % NH, C3 = 3 * NH * HD, CO = NH * HD;
  __global const float* base = qkv + qkv_off + b * T * C3 + h * 3 * HD;
  __global const float* g = dout + dout_off + (b * T + t) * CO + h * HD;
  __global const float* a = att + att_off + (bh * T + t) * T;
  __global float* ds = scratch + scratch_off + (bh * T + t) * T;
  float ada = 0.0f;
  for (long t2 = 0; t2 <= t; ++t2) {
    __global const float* v = base + t2 * C3 + 2 * HD;
    float gv = 0.0f;
    for (long i = 0; i < HD; ++i) gv += g[i] * v[i];
    if (drop_p > 0.0f) gv *= DROPOUT_FACTOR(b, (ulong)((h * T + t) * T + t2));
    ds[t2] = gv;
    ada += a[t2] * gv;
  }
  float acc[MAX_HD];
  for (long i = 0; i < HD; ++i) acc[i] = 0.0f;
  for (long t2 = 0; t2 <= t; ++t2) {
    const float d = a[t2] * (ds[t2] - ada) * scale;
    ds[t2] = d;
    __global const float* k = base + t2 * C3 + HD;
    for (long i = 0; i < HD; ++i) acc[i] += d * k[i];
  }
  __global float* dq = dqkv + dqkv_off + (b * T + t) * C3 + h * 3 * HD;
  for (long i = 0; i < HD; ++i) dq[i] += acc[i];
}

// Backward, by key columns: dk_t2 += sum_{t >= t2} ds[t][t2] q_t and dv_t2 += sum_{t >= t2}
// a'[t][t2] dout_t (a' the dropped-out probabilities). One work-item per (t2, bh), so
// every dk/dv row is written by one work-item.
__kernel void attention_backward_keys(__global float* dqkv, ulong dqkv_off, __global const float* scratch,
                                      ulong scratch_off, __global const float* dout, ulong dout_off,
                                      __global const float* qkv, ulong qkv_off, __global const float* att,
                                      ulong att_off, long T, long NH, long HD, DROPOUT_PARAMS) {
  const long t2 = get_global_id(0), bh = get_global_id(1);
  const long b = bh / NH, h = bh % NH, C3 = 3 * NH * HD, CO = NH * HD;
  __global const float* base = qkv + qkv_off + b * T * C3 + h * 3 * HD;
  float acc_k[MAX_HD], acc_v[MAX_HD];
  for (long i = 0; i < HD; ++i) acc_k[i] = acc_v[i] = 0.0f;
  for (long t = t2; t < T; ++t) {
    const float ds = scratch[scratch_off + (bh * T + t) * T + t2];
    float ap = att[att_off + (bh * T + t) * T + t2];
    if (drop_p > 0.0f) ap *= DROPOUT_FACTOR(b, (ulong)((h * T + t) * T + t2));
    __global const float* q = base + t * C3;
    __global const float* g = dout + dout_off + (b * T + t) * CO + h * HD;
    for (long i = 0; i < HD; ++i) {
      acc_k[i] += ds * q[i];
      acc_v[i] += ap * g[i];
    }
  }
  __global float* dk = dqkv + dqkv_off + (b * T + t2) * C3 + h * 3 * HD + HD;
  for (long i = 0; i < HD; ++i) {
    dk[i] += acc_k[i];
    dk[HD + i] += acc_v[i];
  }
}
