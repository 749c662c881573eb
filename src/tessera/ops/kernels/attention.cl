// Causal self-attention (ops/cpu/attention.cpp). Legend: B batch, T sequence, NH heads,
// HD head dim (at most MAX_HD, checked on the host), C3 = 3*NH*HD (qkv row), CO = NH*HD.
// Per head h of a qkv row: q at h*3*HD, k at +HD, v at +2*HD. att [B,NH,T,T] keeps the
// softmax probabilities before dropout, zeros above the diagonal, in att's dtype (ops.h:
// the activation dtype); scores and softmax are computed in f32.
#define MAX_HD 256

// q_t . k_t2 * scale, for element offset base of the (b, h) block of qkv.
DEVICE_FN float attention_score(CONST_FLOATS(qkv), long base, long t, long t2, long C3, long HD, float scale) {
  float s = 0.0f;
  for (long i = 0; i < HD; ++i) s += LOAD(qkv, base + t * C3 + i) * LOAD(qkv, base + t2 * C3 + HD + i);
  return s * scale;
}
#define SCORE(t2) attention_score(qkv, qkv_off, qkv_dt, base, t, (t2), C3, HD, scale)

// One work-item per (query t, bh = b*NH + h). An f32 probabilities row doubles as the
// score buffer; a 16-bit one cannot hold scores or probabilities unrounded, so there the
// scores are recomputed in each pass (the same f32 operations, so the same values).
__kernel void attention_forward(FLOATS(out), FLOATS(att), CONST_FLOATS(qkv), long T, long NH, long HD, float scale,
                                DROPOUT_PARAMS) {
  const long t = get_global_id(0), bh = get_global_id(1);
  const long b = bh / NH, h = bh % NH, C3 = 3 * NH * HD, CO = NH * HD;
  const long base = b * T * C3 + h * 3 * HD;  // the (b, h) block of qkv
  const long a = (bh * T + t) * T;             // this query's row of att
  const bool keep = att_dt == DT_F32;
  float mx = -INFINITY;
  for (long t2 = 0; t2 <= t; ++t2) {
    const float s = SCORE(t2);
    if (keep) STORE(att, a + t2, s);
    mx = fmax(mx, s);
  }
  float sum = 0.0f;
  for (long t2 = 0; t2 <= t; ++t2) {
    const float e = exp_approx((keep ? LOAD(att, a + t2) : SCORE(t2)) - mx);
    if (keep) STORE(att, a + t2, e);
    sum += e;
  }
  const float inv = 1.0f / sum;
  for (long t2 = 0; t2 < T; ++t2)
    STORE(att, a + t2, t2 <= t ? (keep ? LOAD(att, a + t2) : exp_approx(SCORE(t2) - mx)) * inv : 0.0f);
  // out_t = sum over keys of the f32 probability * dropout factor * v_t2 (ops.h); the
  // dropout element of (h, t, t2) in the sample's full [heads, T, T] is (h*T + t)*T + t2
  // (+ element_offset).
  float acc[MAX_HD];
  for (long i = 0; i < HD; ++i) acc[i] = 0.0f;
  for (long t2 = 0; t2 <= t; ++t2) {
    float w = keep ? LOAD(att, a + t2) : exp_approx(SCORE(t2) - mx) * inv;
    if (drop_p > 0.0f) w *= DROPOUT_FACTOR(b, (ulong)((h * T + t) * T + t2));
    for (long i = 0; i < HD; ++i) acc[i] += w * LOAD(qkv, base + t2 * C3 + 2 * HD + i);
  }
  const long y = (b * T + t) * CO + h * HD;
  for (long i = 0; i < HD; ++i) STORE(out, y + i, acc[i]);
}

// Backward, by query rows: d a[t2] = (dout_t . v_t2) * factor, the softmax backward to
// score gradients ds (kept in scratch, f32, times the 1/sqrt(HD) of the scores), then
// dq_t += sum_t2 ds[t2] k_t2. One work-item per (t, bh).
__kernel void attention_backward_rows(FLOATS(dqkv), __global float* scratch, ulong scratch_off, CONST_FLOATS(dout),
                                      CONST_FLOATS(qkv), CONST_FLOATS(att), long T, long NH, long HD, float scale,
                                      DROPOUT_PARAMS) {
  const long t = get_global_id(0), bh = get_global_id(1);
  const long b = bh / NH, h = bh % NH, C3 = 3 * NH * HD, CO = NH * HD;
  const long base = b * T * C3 + h * 3 * HD;
  const long g = (b * T + t) * CO + h * HD;  // dout_t
  const long a = (bh * T + t) * T;
  __global float* ds = scratch + scratch_off + a;
  float ada = 0.0f;
  for (long t2 = 0; t2 <= t; ++t2) {
    float gv = 0.0f;
    for (long i = 0; i < HD; ++i) gv += LOAD(dout, g + i) * LOAD(qkv, base + t2 * C3 + 2 * HD + i);
    if (drop_p > 0.0f) gv *= DROPOUT_FACTOR(b, (ulong)((h * T + t) * T + t2));
    ds[t2] = gv;
    ada += LOAD(att, a + t2) * gv;
  }
  float acc[MAX_HD];
  for (long i = 0; i < HD; ++i) acc[i] = 0.0f;
  for (long t2 = 0; t2 <= t; ++t2) {
    const float d = LOAD(att, a + t2) * (ds[t2] - ada) * scale;
    ds[t2] = d;
    for (long i = 0; i < HD; ++i) acc[i] += d * LOAD(qkv, base + t2 * C3 + HD + i);
  }
  const long dq = (b * T + t) * C3 + h * 3 * HD;
  for (long i = 0; i < HD; ++i) ADD_TO(dqkv, dq + i, acc[i]);
}

// Backward, by key columns: dk_t2 += sum_{t >= t2} ds[t][t2] q_t and dv_t2 += sum_{t >= t2}
// a'[t][t2] dout_t (a' the dropped-out probabilities). One work-item per (t2, bh), so
// every dk/dv row is written by one work-item.
__kernel void attention_backward_keys(FLOATS(dqkv), __global const float* scratch, ulong scratch_off,
                                      CONST_FLOATS(dout), CONST_FLOATS(qkv), CONST_FLOATS(att), long T, long NH,
                                      long HD, DROPOUT_PARAMS) {
  const long t2 = get_global_id(0), bh = get_global_id(1);
  const long b = bh / NH, h = bh % NH, C3 = 3 * NH * HD, CO = NH * HD;
  const long base = b * T * C3 + h * 3 * HD;
  float acc_k[MAX_HD], acc_v[MAX_HD];
  for (long i = 0; i < HD; ++i) acc_k[i] = acc_v[i] = 0.0f;
  for (long t = t2; t < T; ++t) {
    const float ds = scratch[scratch_off + (bh * T + t) * T + t2];
    float ap = LOAD(att, (bh * T + t) * T + t2);
    if (drop_p > 0.0f) ap *= DROPOUT_FACTOR(b, (ulong)((h * T + t) * T + t2));
    const long g = (b * T + t) * CO + h * HD;
    for (long i = 0; i < HD; ++i) {
      acc_k[i] += ds * LOAD(qkv, base + t * C3 + i);
      acc_v[i] += ap * LOAD(dout, g + i);
    }
  }
  const long dk = (b * T + t2) * C3 + h * 3 * HD + HD;
  for (long i = 0; i < HD; ++i) {
    ADD_TO(dqkv, dk + i, acc_k[i]);
    ADD_TO(dqkv, dk + HD + i, acc_v[i]);
  }
}
