// Fused causal attention (ops.h flash_attention_*; ops/cpu/flash_attention.cpp is the fast CPU
// kernel): the forward streams the keys in tiles of FLASH_TILE with an online softmax (running
// max and denominator, the partial output rescaled when the max grows) and saves only the
// log-sum-exp; the backward recomputes each probability from it. Work-items hold one query row
// (or one key row) in private memory; no T x T buffer anywhere. Uses attention.cl's MAX_HD,
// rope_inv_freq and rope_channel (q and k rotated as they are read, as attention_qkv does).
// Legend: B batch, T sequence, NG query groups, R = NH/NG, NH heads, HD head dim (<= MAX_HD,
// checked on the host); qkv/dqkv rows QR = NG*(R+2)*HD wide in Megatron's grouped layout
// (group g: R queries, then its key, then its value), out/dout rows NH*HD; lse and D (the
// scratch: rowsum(dout * out)) f32 [B,NH,T]. Block pairs (ops.h AttentionBlock): kv's rows give the
// keys and values, rows sit at the positions POS_ARGS say (flash_position), a key is visible to
// a query at or after its position, and dropout element (h*S + query position)*S + key position
// as attention.cl's over a sequence of S.
#define FLASH_TILE 64

// dst[c] = channel c (< HD) of the head at element `head` of x, rotated to position t, times scale.
DEVICE_FN void flash_load_head(float* dst, CONST_FLOATS(x), long head, long HD, long t, ROPE_ARGS, float scale) {
  for (long c = 0; c < HD; ++c)
    dst[c] = rope_channel(x, x_off, x_dt, head, c, pairs, t, base, factor, low, high, context, 1.0f) * scale;
}

// x rotated by -theta of position t in place (the transpose of the rotation).
DEVICE_FN void flash_rotate_back(float* x, long t, ROPE_ARGS) {
  for (long i = 0; i < pairs; ++i) {
    const float theta = (float)t * rope_inv_freq(i, pairs, base, factor, low, high, context);
    const float co = cos(theta), si = -sin(theta), x1 = x[i], x2 = x[i + pairs];
    x[i] = x1 * co - x2 * si;
    x[i + pairs] = x2 * co + x1 * si;
  }
}

DEVICE_FN float flash_dot(const float* a, const float* b, long n) {
  float s = 0.0f;
  for (long c = 0; c < n; ++c) s += a[c] * b[c];
  return s;
}

// The position of row t of a tensor placed by (split, first, second): ops.h SequenceRows.
DEVICE_FN long flash_position(long t, long split, long first, long second) {
  return split == 0 || t < split ? first + t : second + (t - split);
}
#define POS_ARGS long S, long q_split, long q_first, long q_second, long k_split, long k_first, long k_second
#define QPOS(t) flash_position((t), q_split, q_first, q_second)
#define KPOS(t) flash_position((t), k_split, k_first, k_second)

// Work-item (query t, bh = b*NH + h). merge: (out, lse) hold earlier keys' attention.
__kernel void flash_attention_forward(FLOATS(out), __global float* lse, ulong lse_off, CONST_FLOATS(qkv),
                                      CONST_FLOATS(kv), long T, long NH, long NG, long HD, float scale, ROPE_ARGS,
                                      DROPOUT_PARAMS, POS_ARGS, int merge) {
  const long t = get_global_id(0), bh = get_global_id(1);
  const long b = bh / NH, h = bh % NH, R = NH / NG, g = h / R, QR = NG * (R + 2) * HD;
  const long k_col = g * (R + 2) * HD + R * HD, v_col = k_col + HD, pq = QPOS(t);
  const long y = (b * T + t) * NH * HD + h * HD;
  float q[MAX_HD], k[MAX_HD], acc[MAX_HD], s[FLASH_TILE];
  flash_load_head(q, qkv, qkv_off, qkv_dt, (b * T + t) * QR + g * (R + 2) * HD + (h % R) * HD, HD, pq, pairs, base,
                  factor, low, high, context, scale);
  float m = -INFINITY, l = 0.0f;
  if (merge) {  // the online softmax's state of the keys seen before: max lse, sum 1, output out
    m = lse[lse_off + bh * T + t];
    l = isinf(m) ? 0.0f : 1.0f;
  }
  for (long c = 0; c < HD; ++c) acc[c] = merge ? LOAD(out, y + c) : 0.0f;
  for (long k0 = 0; k0 < T && KPOS(k0) <= pq; k0 += FLASH_TILE) {
    long n = 0;
    while (n < FLASH_TILE && k0 + n < T && KPOS(k0 + n) <= pq) ++n;
    float mx = m;
    for (long j = 0; j < n; ++j) {
      flash_load_head(k, kv, kv_off, kv_dt, (b * T + k0 + j) * QR + k_col, HD, KPOS(k0 + j), pairs, base, factor,
                      low, high, context, 1.0f);
      s[j] = flash_dot(q, k, HD);
      mx = fmax(mx, s[j]);
    }
    const float correction = exp_approx(m - mx);
    l *= correction;
    for (long c = 0; c < HD; ++c) acc[c] *= correction;
    for (long j = 0; j < n; ++j) {
      float p = exp_approx(s[j] - mx);
      l += p;
      if (drop_p > 0.0f) p *= DROPOUT_FACTOR(b, (ulong)((h * S + pq) * S + KPOS(k0 + j)));
      const long v = (b * T + k0 + j) * QR + v_col;
      for (long c = 0; c < HD; ++c) acc[c] += p * LOAD(kv, v + c);
    }
    m = mx;
  }
  const bool seen = l > 0.0f;  // a row that saw no key: out 0, lse -inf
  for (long c = 0; c < HD; ++c) STORE(out, y + c, seen ? acc[c] / l : 0.0f);
  lse[lse_off + bh * T + t] = seen ? m + log(l) : -INFINITY;
}

// Backward by query rows, work-item (t, bh): D_t into the scratch, and dq_t += scale *
// sum_key p (dp * factor - D_t) k_key (in the rotated frame, then rotated back).
__kernel void flash_attention_backward_rows(FLOATS(dqkv), __global float* scratch, ulong scratch_off,
                                            CONST_FLOATS(dout), CONST_FLOATS(qkv), CONST_FLOATS(kv),
                                            CONST_FLOATS(out), __global const float* lse, ulong lse_off, long T,
                                            long NH, long NG, long HD, float scale, ROPE_ARGS, DROPOUT_PARAMS,
                                            POS_ARGS) {
  const long t = get_global_id(0), bh = get_global_id(1);
  const long b = bh / NH, h = bh % NH, R = NH / NG, g = h / R, QR = NG * (R + 2) * HD;
  const long q_col = g * (R + 2) * HD + (h % R) * HD, k_col = g * (R + 2) * HD + R * HD, v_col = k_col + HD;
  const long y = (b * T + t) * NH * HD + h * HD, pq = QPOS(t);
  float q[MAX_HD], go[MAX_HD], k[MAX_HD], dq[MAX_HD];
  flash_load_head(q, qkv, qkv_off, qkv_dt, (b * T + t) * QR + q_col, HD, pq, pairs, base, factor, low, high, context,
                  scale);
  float D = 0.0f;
  for (long c = 0; c < HD; ++c) {
    go[c] = LOAD(dout, y + c);
    D += go[c] * LOAD(out, y + c);
    dq[c] = 0.0f;
  }
  scratch[scratch_off + bh * T + t] = D;
  const float m = lse[lse_off + bh * T + t];
  for (long key = 0; key < T && KPOS(key) <= pq; ++key) {
    const long row = (b * T + key) * QR, pk = KPOS(key);
    flash_load_head(k, kv, kv_off, kv_dt, row + k_col, HD, pk, pairs, base, factor, low, high, context, 1.0f);
    const float p = exp_approx(flash_dot(q, k, HD) - m);
    float dp = 0.0f;
    for (long c = 0; c < HD; ++c) dp += go[c] * LOAD(kv, row + v_col + c);
    if (drop_p > 0.0f) dp *= DROPOUT_FACTOR(b, (ulong)((h * S + pq) * S + pk));
    const float ds = p * (dp - D);
    for (long c = 0; c < HD; ++c) dq[c] += ds * k[c];
  }
  for (long c = 0; c < HD; ++c) dq[c] *= scale;
  flash_rotate_back(dq, pq, pairs, base, factor, low, high, context);
  const long x = (b * T + t) * QR + q_col;
  for (long c = 0; c < HD; ++c) ADD_TO(dqkv, x + c, dq[c]);
}

// Backward by key rows of kv, work-item (key, bg = b*NG + g), after the rows kernel (it reads
// D): the group's dk and dv into dkv over its R heads and the queries at or after the key's
// position, so each dk/dv row has one writer.
__kernel void flash_attention_backward_keys(FLOATS(dkv), __global const float* scratch, ulong scratch_off,
                                            CONST_FLOATS(dout), CONST_FLOATS(qkv), CONST_FLOATS(kv),
                                            __global const float* lse, ulong lse_off, long T, long NH, long NG,
                                            long HD, float scale, ROPE_ARGS, DROPOUT_PARAMS, POS_ARGS) {
  const long key = get_global_id(0), bg = get_global_id(1);
  const long b = bg / NG, g = bg % NG, R = NH / NG, QR = NG * (R + 2) * HD;
  const long k_col = g * (R + 2) * HD + R * HD, v_col = k_col + HD, pk = KPOS(key);
  float k[MAX_HD], v[MAX_HD], q[MAX_HD], dk[MAX_HD], dv[MAX_HD];
  const long krow = (b * T + key) * QR;
  flash_load_head(k, kv, kv_off, kv_dt, krow + k_col, HD, pk, pairs, base, factor, low, high, context, 1.0f);
  for (long c = 0; c < HD; ++c) {
    v[c] = LOAD(kv, krow + v_col + c);
    dk[c] = dv[c] = 0.0f;
  }
  for (long h = g * R; h < (g + 1) * R; ++h) {
    const long bh = b * NH + h, q_col = g * (R + 2) * HD + (h % R) * HD;
    for (long t = 0; t < T; ++t) {
      const long pq = QPOS(t);
      if (pq < pk) continue;
      flash_load_head(q, qkv, qkv_off, qkv_dt, (b * T + t) * QR + q_col, HD, pq, pairs, base, factor, low, high,
                      context, scale);
      const float p = exp_approx(flash_dot(q, k, HD) - lse[lse_off + bh * T + t]);
      const long y = (b * T + t) * NH * HD + h * HD;
      float dp = 0.0f;
      for (long c = 0; c < HD; ++c) dp += LOAD(dout, y + c) * v[c];
      const float f = drop_p > 0.0f ? DROPOUT_FACTOR(b, (ulong)((h * S + pq) * S + pk)) : 1.0f;
      const float ds = p * (dp * f - scratch[scratch_off + bh * T + t]);
      for (long c = 0; c < HD; ++c) {
        dk[c] += ds * q[c];
        dv[c] += p * f * LOAD(dout, y + c);
      }
    }
  }
  flash_rotate_back(dk, pk, pairs, base, factor, low, high, context);
  for (long c = 0; c < HD; ++c) {
    ADD_TO(dkv, krow + k_col + c, dk[c]);
    ADD_TO(dkv, krow + v_col + c, dv[c]);
  }
}
