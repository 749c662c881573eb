// Element-wise kernels: residual, GeLU, SwiGLU, dropout, bias, scaling, and the fused
// epilogues (ops/cpu/residual.cpp, gelu.cpp, swiglu.cpp, dropout.cpp, linear.cpp's bias_add,
// epilogue.cpp, reductions.cpp's scale_inplace). One work-item per element unless a kernel
// says otherwise.

__kernel void residual_forward(FLOATS(out), CONST_FLOATS(a), CONST_FLOATS(b)) {
  const long i = get_global_id(0);
  STORE(out, i, LOAD(a, i) + LOAD(b, i));
}

// dst (+)= src (the backward of a residual or of a disabled dropout), per GRAD_TO.
__kernel void accumulate(FLOATS(dst), CONST_FLOATS(src), int assign) {
  const long i = get_global_id(0);
  GRAD_TO(dst, i, LOAD(src, i), assign);
}

// GeLU (ops/cpu/gelu.cpp): tanh form as x * sigmoid(2u), erf form as x Phi(x).
#define GELU_K0 0.79788456f
#define GELU_K1 0.044715f
#define INV_SQRT2 0.70710678118654752f
#define INV_SQRT2PI 0.39894228040143268f

DEVICE_FN float gelu_value(float x, int erf_kind) {
  if (erf_kind) return 0.5f * x * (1.0f + erf_approx(x * INV_SQRT2));
  const float u = GELU_K0 * (x + GELU_K1 * x * x * x);
  return x * sigmoid_approx(2.0f * u);
}

DEVICE_FN float gelu_grad(float x, int erf_kind) {
  if (erf_kind) {
    const float cdf = 0.5f * (1.0f + erf_approx(x * INV_SQRT2));
    const float pdf = INV_SQRT2PI * exp_approx(-0.5f * x * x);
    return cdf + x * pdf;
  }
  const float u = GELU_K0 * (x + GELU_K1 * x * x * x);
  const float du = GELU_K0 * (1.0f + 3.0f * GELU_K1 * x * x);
  const float s = sigmoid_approx(2.0f * u);
  return s + 2.0f * x * s * (1.0f - s) * du;
}

__kernel void gelu_forward(FLOATS(out), CONST_FLOATS(inp), int erf_kind) {
  const long i = get_global_id(0);
  STORE(out, i, gelu_value(LOAD(inp, i), erf_kind));
}

__kernel void gelu_backward(FLOATS(dinp), CONST_FLOATS(dout), CONST_FLOATS(inp), int erf_kind, int assign) {
  const long i = get_global_id(0);
  GRAD_TO(dinp, i, LOAD(dout, i) * gelu_grad(LOAD(inp, i), erf_kind), assign);
}

// The fused linear + bias + GeLU's epilogue (ops/cpu/epilogue.cpp) after the GEMM wrote
// pre = inp @ W^T: pre += bias[o] (absent: nothing added), out = gelu(pre as stored).
// One work-item per element of the [N, OC] rows.
__kernel void bias_gelu_forward(FLOATS(out), FLOATS(pre), CONST_FLOATS(bias), long OC, int erf_kind) {
  const long i = get_global_id(0);
  if (bias) STORE(pre, i, LOAD(pre, i) + LOAD(bias, i % OC));
  STORE(out, i, gelu_value(LOAD(pre, i), erf_kind));
}

// Its backward's first pass (cuBLASLt's DGELU_BGRAD): dpre = dout * gelu'(pre), read
// before written (dpre may be dout), and dbias += its column sums (of dpre as stored), rows
// in order (dbias = with assign). One work-item per column o of [N, OC].
__kernel void dgelu_bgrad(FLOATS(dpre), FLOATS(dbias), CONST_FLOATS(dout), CONST_FLOATS(pre), long N, long OC,
                          int erf_kind, int assign) {
  const long o = get_global_id(0);
  float acc = 0.0f;
  for (long n = 0; n < N; ++n) {
    const long i = n * OC + o;
    const float d = LOAD(dout, i) * gelu_grad(LOAD(pre, i), erf_kind);
    STORE(dpre, i, d);
    acc += round_to(d, dpre_dt);
  }
  if (dbias) GRAD_TO(dbias, o, acc, assign);
}

// SwiGLU (ops/cpu/swiglu.cpp): out[n, f] = silu(gate) * up, gate = inp[n, f], up =
// inp[n, F + f], silu(x) = x / (1 + exp(-x)). One work-item per element of out.
__kernel void swiglu_forward(FLOATS(out), CONST_FLOATS(inp), long F) {
  const long i = get_global_id(0), gate_i = i / F * 2 * F + i % F;
  const float g = LOAD(inp, gate_i);
  STORE(out, i, g / (1.0f + exp_approx(-g)) * LOAD(inp, gate_i + F));
}

// dgate += dout * up * s (1 + gate (1 - s)), s = sigmoid(gate); dup += dout * silu(gate).
__kernel void swiglu_backward(FLOATS(dinp), CONST_FLOATS(dout), CONST_FLOATS(inp), long F, int assign) {
  const long i = get_global_id(0), gate_i = i / F * 2 * F + i % F;
  const float g = LOAD(inp, gate_i), e = 1.0f + exp_approx(-g), s = 1.0f / e, dy = LOAD(dout, i);
  GRAD_TO(dinp, gate_i, dy * LOAD(inp, gate_i + F) * (s * (1.0f + g * (1.0f - s))), assign);
  GRAD_TO(dinp, gate_i + F, dy * (g / e), assign);
}

// Dropout over [B, S]: work-item (Philox group q, sample b) draws one Philox call and
// applies its 4 lanes to the (up to 4) elements of this shard it covers: group q holds
// the per-sample indices [4(g0+q), 4(g0+q)+4), g0 = element_offset / 4 (the CPU's
// dropout_factors draws the same groups). out may alias inp.
#define DROPOUT_GROUPS_BODY(apply)                                                             \
  const long q = get_global_id(0), b = get_global_id(1);                                      \
  const ulong group = drop_element_offset / 4 + (ulong)q;                                      \
  const uint4 r = philox4x32(drop_seed, RNG_STREAM_DROPOUT,                                    \
                             make_uint4((uint)group, drop_sample0 + (uint)b, drop_site, DROP_ITERATION)); \
  for (int lane = 0; lane < 4; ++lane) {                                                       \
    const long e = (long)(group * 4 + (ulong)lane - drop_element_offset);                      \
    if (e >= 0 && e < S) {                                                                     \
      const uint bits = lane == 0 ? r.x : lane == 1 ? r.y : lane == 2 ? r.z : r.w;             \
      const float factor = uint_to_unit_float(bits) >= drop_p ? drop_scale : 0.0f;             \
      const long i = b * S + e;                                                                \
      apply;                                                                                   \
    }                                                                                          \
  }

__kernel void dropout_forward(FLOATS(out), CONST_FLOATS(inp), long S, DROPOUT_PARAMS) {
  DROPOUT_GROUPS_BODY(STORE(out, i, LOAD(inp, i) * factor))
}

// dinp += dout * factor as one fused multiply-add, as the CPU computes it (not left to
// contraction, which OpenCL compilers may do and nvcc --fmad=false does not); added to 0
// without reading dinp when assigning.
__kernel void dropout_backward(FLOATS(dinp), CONST_FLOATS(dout), long S, int assign, DROPOUT_PARAMS) {
  DROPOUT_GROUPS_BODY(STORE(dinp, i, fma(LOAD(dout, i), factor, assign ? 0.0f : LOAD(dinp, i))))
}

// The fused bias + dropout + residual add (ops/cpu/epilogue.cpp): out = residual + (inp +
// bias[e % OC]) * factor over [B, S] (S a multiple of OC; bias absent: nothing added),
// with dropout_forward's mask, the sum and the dropped value rounded to inp's dtype (the
// unfused ops' roundings; nothing for f32). out may alias inp or residual.
__kernel void bias_dropout_add_forward(FLOATS(out), CONST_FLOATS(inp), CONST_FLOATS(bias), CONST_FLOATS(residual),
                                       long S, long OC, DROPOUT_PARAMS) {
  DROPOUT_GROUPS_BODY(const float t = round_to(LOAD(inp, i) + (bias ? LOAD(bias, e % OC) : 0.0f), inp_dt);
                      STORE(out, i, LOAD(residual, i) + round_to(t * factor, inp_dt)))
}

// Its backward in one pass, one work-item per column o of the [N, OC] rows (R = S / OC
// rows per sample): the contribution dout * factor (the mask drawn per element, as
// dropout_factor does) goes into dinp per GRAD_TO and, as a 16-bit dinp (else dout) would
// store it, into dbias's column sum, rows in order; dout itself into dresidual. Any of the
// three may be absent.
__kernel void bias_dropout_add_backward(FLOATS(dinp), FLOATS(dbias), FLOATS(dresidual), CONST_FLOATS(dout), long N,
                                        long OC, long S, int assign, DROPOUT_PARAMS) {
  const long o = get_global_id(0);
  float acc = 0.0f;
  for (long n = 0; n < N; ++n) {
    const long i = n * OC + o;
    const float g = LOAD(dout, i);
    const float c = g * (drop_p > 0.0f ? DROPOUT_FACTOR(i / S, (ulong)(i % S)) : 1.0f);
    if (dinp) GRAD_TO(dinp, i, c, assign);
    if (dresidual) GRAD_TO(dresidual, i, g, assign);
    acc += round_to(c, dinp ? dinp_dt : dout_dt);
  }
  if (dbias) ADD_TO(dbias, o, acc);
}

// out[n, o] = inp[n, o] + bias[o] (just inp[n, o] when bias is absent) over a block of
// rows with leading dimensions ld_out and ld_inp: bias_add_forward, and the block copies
// (widening, rounding, adding the bias) of the 16-bit linear. Work-item (o, n).
__kernel void rows_plus_bias(FLOATS(out), long ld_out, CONST_FLOATS(inp), long ld_inp, CONST_FLOATS(bias)) {
  const long o = get_global_id(0), n = get_global_id(1);
  const float v = LOAD(inp, n * ld_inp + o);
  STORE(out, n * ld_out + o, bias ? v + LOAD(bias, o) : v);
}

// out[n, o] = bias[o] (the f32 linear's GEMM then adds onto it).
__kernel void broadcast_bias(FLOATS(out), CONST_FLOATS(bias), long OC) {
  const long o = get_global_id(0), n = get_global_id(1);
  STORE(out, n * OC + o, LOAD(bias, o));
}

// dbias[o] (+)= column sum of dy[N, OC] (GRAD_TO); one work-item per column, rows in order.
__kernel void column_sums(FLOATS(dbias), CONST_FLOATS(dy), long N, long OC, int assign) {
  const long o = get_global_id(0);
  float acc = 0.0f;
  for (long n = 0; n < N; ++n) acc += LOAD(dy, n * OC + o);
  GRAD_TO(dbias, o, acc, assign);
}

__kernel void scale_inplace(FLOATS(x), float scale) {
  const long i = get_global_id(0);
  STORE(x, i, LOAD(x, i) * scale);
}

__kernel void fill(FLOATS(out), float value) { STORE(out, get_global_id(0), value); }

// ops.h convert: out = inp, widened on load and rounded once to out's dtype.
__kernel void convert(FLOATS(out), CONST_FLOATS(inp)) {
  const long i = get_global_id(0);
  STORE(out, i, LOAD(inp, i));
}

// ops.h masked_loss_backward: dlosses (+)= mask * scale.
__kernel void masked_loss_backward(__global float* dl, ulong dl_off, __global const float* mask, ulong mask_off,
                                   float scale, int assign) {
  const long i = get_global_id(0);
  dl[dl_off + i] = (assign ? 0.0f : dl[dl_off + i]) + mask[mask_off + i] * scale;
}
