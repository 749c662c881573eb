// Causal self-attention (ops/cpu/attention.cpp) and, at the end, its QKV layout with RoPE
// and the keys and values apart (ops/cpu/attention_qkv.cpp). Legend: B batch, T sequence,
// NH heads, HD head dim (at most MAX_HD, checked on the host), C3 = 3*NH*HD (qkv row),
// CO = NH*HD.
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

// The grouped QKV layout to the per-head one, with RoPE on q and k (ops/cpu/attention_qkv.cpp).
// Legend: NG query groups, R = NH/NG query heads per group, pairs = rope dim / 2. A grouped
// row (qkv, dqkv) holds per group [q_0 .. q_{R-1}, k, v], a per-head row (out, dout) per
// head h = g*R + i [q_h, k_g, v_g], HD wide each.

// RoPE's frequency i of `pairs` (ops.h rope_inv_freq, the same steps in f32): 1 / base^(2i /
// (2*pairs)), then, when factor > 0, Llama 3.1's scaling with low/high frequency factors and
// the original context `context`.
DEVICE_FN float rope_inv_freq(long i, long pairs, float base, float factor, float low, float high, float context) {
  const float f = 1.0f / pow(base, (float)(2 * i) / (float)(2 * pairs));
  if (factor == 0.0f) return f;
  const float wavelen = 6.2831855f / f;
  if (wavelen < context / high) return f;
  if (wavelen > context / low) return f / factor;
  const float smooth = (context / wavelen - low) / (high - low);
  return (1.0f - smooth) * f / factor + smooth * f;
}

// Channel c of the head starting at element `head` of x, rotated by sign * theta_i of
// position t (theta_i = t * inv_freq[i] in f32, inv_freq[i] rope_inv_freq's), channel
// i < pairs paired with i + pairs; channels [2*pairs, HD) as they are.
DEVICE_FN float rope_channel(CONST_FLOATS(x), long head, long c, long pairs, long t, float base, float factor,
                             float low, float high, float context, float sign) {
  if (c >= 2 * pairs) return load_float(x, x_off + (ulong)(head + c), x_dt);
  const long i = c < pairs ? c : c - pairs;
  const float theta = (float)t * rope_inv_freq(i, pairs, base, factor, low, high, context);
  const float co = cos(theta), si = sign * sin(theta);
  const float x1 = load_float(x, x_off + (ulong)(head + i), x_dt);
  const float x2 = load_float(x, x_off + (ulong)(head + i + pairs), x_dt);
  return c < pairs ? x1 * co - x2 * si : x2 * co + x1 * si;
}
#define ROPE(x, head, c, sign) \
  rope_channel(x, x##_off, x##_dt, (head), (c), pairs, t, base, factor, low, high, context, (sign))
// The rope arguments every kernel below takes (Launch's scalars in attention_host.inc).
#define ROPE_ARGS long pairs, float base, float factor, float low, float high, float context

// Work-item (element of a per-head row, row = b*T + t).
__kernel void attention_qkv_forward(FLOATS(out), CONST_FLOATS(qkv), long T, long NG, long R, long HD, ROPE_ARGS) {
  const long col = get_global_id(0), row = get_global_id(1), t = row % T;
  const long h = col / (3 * HD), part = col / HD % 3, c = col % HD, g = h / R;
  // q_h, k_g or v_g of the group's [q_0 .. q_{R-1}, k, v]
  const long head = row * NG * (R + 2) * HD + g * (R + 2) * HD + (part == 0 ? h % R : R + part - 1) * HD;
  STORE(out, row * NG * R * 3 * HD + col, part == 2 ? LOAD(qkv, head + c) : ROPE(qkv, head, c, 1.0f));
}

// Work-item (element of a grouped row, row). dq: its head's gradient rotated back; dk, dv:
// those of the group's R heads (dk rotated back) added in head order, rounded once.
__kernel void attention_qkv_backward(FLOATS(dqkv), CONST_FLOATS(dout), long T, long NG, long R, long HD,
                                     ROPE_ARGS) {
  const long col = get_global_id(0), row = get_global_id(1), t = row % T;
  const long g = col / ((R + 2) * HD), slot = col / HD % (R + 2), c = col % HD;
  const long heads = row * NG * R * 3 * HD + g * R * 3 * HD;  // head g*R's [q; k; v] in dout
  const long i = row * NG * (R + 2) * HD + col;
  if (slot < R) {
    ADD_TO(dqkv, i, ROPE(dout, heads + slot * 3 * HD, c, -1.0f));
    return;
  }
  float acc = LOAD(dqkv, i);
  for (long r = 0; r < R; ++r) {
    const long head = heads + r * 3 * HD + (slot - R + 1) * HD;  // k at +HD, v at +2*HD
    acc += slot == R ? ROPE(dout, head, c, -1.0f) : LOAD(dout, head + c);
  }
  STORE(dqkv, i, acc);
}

// attention_kv_pack/unpack, work-item e of kv's elements: run i = e / (2*HD) (the k and v of
// one group of one row) sits at i*(R+2)*HD + R*HD in qkv.
__kernel void attention_kv_pack(FLOATS(kv), CONST_FLOATS(qkv), long R, long HD) {
  const long e = get_global_id(0), i = e / (2 * HD);
  STORE(kv, e, LOAD(qkv, i * (R + 2) * HD + R * HD + e % (2 * HD)));
}

__kernel void attention_kv_unpack(FLOATS(qkv), CONST_FLOATS(kv), long R, long HD, int assign) {
  const long e = get_global_id(0), i = e / (2 * HD);
  GRAD_TO(qkv, i * (R + 2) * HD + R * HD + e % (2 * HD), LOAD(kv, e), assign);
}
