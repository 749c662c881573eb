// Element-wise kernels: residual, GeLU, SwiGLU, dropout, bias, scaling (ops/cpu/residual.cpp,
// gelu.cpp, swiglu.cpp, dropout.cpp, linear.cpp's bias_add, reductions.cpp's scale_inplace). One
// work-item per element.

__kernel void residual_forward(FLOATS(out), CONST_FLOATS(a), CONST_FLOATS(b)) {
  const long i = get_global_id(0);
  STORE(out, i, LOAD(a, i) + LOAD(b, i));
}

// dst += src (the backward of a residual or of a disabled dropout).
__kernel void accumulate(FLOATS(dst), CONST_FLOATS(src)) {
  const long i = get_global_id(0);
  ADD_TO(dst, i, LOAD(src, i));
}

// GeLU (ops/cpu/gelu.cpp): tanh form as x * sigmoid(2u), erf form as x Phi(x).
#define GELU_K0 0.79788456f
#define GELU_K1 0.044715f
#define INV_SQRT2 0.70710678118654752f
#define INV_SQRT2PI 0.39894228040143268f

__kernel void gelu_forward(FLOATS(out), CONST_FLOATS(inp), int erf_kind) {
  const long i = get_global_id(0);
  const float x = LOAD(inp, i);
  if (erf_kind) {
    STORE(out, i, 0.5f * x * (1.0f + erf_approx(x * INV_SQRT2)));
  } else {
    const float u = GELU_K0 * (x + GELU_K1 * x * x * x);
    STORE(out, i, x * sigmoid_approx(2.0f * u));
  }
}

__kernel void gelu_backward(FLOATS(dinp), CONST_FLOATS(dout), CONST_FLOATS(inp), int erf_kind) {
  const long i = get_global_id(0);
  const float x = LOAD(inp, i);
  float d;
  if (erf_kind) {
    const float cdf = 0.5f * (1.0f + erf_approx(x * INV_SQRT2));
    const float pdf = INV_SQRT2PI * exp_approx(-0.5f * x * x);
    d = cdf + x * pdf;
  } else {
    const float u = GELU_K0 * (x + GELU_K1 * x * x * x);
    const float du = GELU_K0 * (1.0f + 3.0f * GELU_K1 * x * x);
    const float s = sigmoid_approx(2.0f * u);
    d = s + 2.0f * x * s * (1.0f - s) * du;
  }
  ADD_TO(dinp, i, LOAD(dout, i) * d);
}

// SwiGLU (ops/cpu/swiglu.cpp): out[n, f] = silu(gate) * up, gate = inp[n, f], up =
// inp[n, F + f], silu(x) = x / (1 + exp(-x)). One work-item per element of out.
__kernel void swiglu_forward(FLOATS(out), CONST_FLOATS(inp), long F) {
  const long i = get_global_id(0), gate_i = i / F * 2 * F + i % F;
  const float g = LOAD(inp, gate_i);
  STORE(out, i, g / (1.0f + exp_approx(-g)) * LOAD(inp, gate_i + F));
}

// dgate += dout * up * s (1 + gate (1 - s)), s = sigmoid(gate); dup += dout * silu(gate).
__kernel void swiglu_backward(FLOATS(dinp), CONST_FLOATS(dout), CONST_FLOATS(inp), long F) {
  const long i = get_global_id(0), gate_i = i / F * 2 * F + i % F;
  const float g = LOAD(inp, gate_i), e = 1.0f + exp_approx(-g), s = 1.0f / e, dy = LOAD(dout, i);
  ADD_TO(dinp, gate_i, dy * LOAD(inp, gate_i + F) * (s * (1.0f + g * (1.0f - s))));
  ADD_TO(dinp, gate_i + F, dy * (g / e));
}

// Dropout over [B, S]: work-item (Philox group q, sample b) draws one Philox call and
// applies its 4 lanes to the (up to 4) elements of this shard it covers: group q holds
// the per-sample indices [4(g0+q), 4(g0+q)+4), g0 = element_offset / 4 (the CPU's
// dropout_factors draws the same groups). out may alias inp.
#define DROPOUT_GROUPS_BODY(apply)                                                             \
  const long q = get_global_id(0), b = get_global_id(1);                                      \
  const ulong group = drop_element_offset / 4 + (ulong)q;                                      \
  const uint4 r = philox4x32(drop_seed, RNG_STREAM_DROPOUT,                                    \
                             make_uint4((uint)group, drop_sample0 + (uint)b, drop_site, drop_iteration));  \
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
// contraction, which OpenCL compilers may do and nvcc --fmad=false does not).
__kernel void dropout_backward(FLOATS(dinp), CONST_FLOATS(dout), long S, DROPOUT_PARAMS) {
  DROPOUT_GROUPS_BODY(STORE(dinp, i, fma(LOAD(dout, i), factor, LOAD(dinp, i))))
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

// dbias[o] += column sum of dy[N, OC]; one work-item per column, rows in order.
__kernel void column_sums(FLOATS(dbias), CONST_FLOATS(dy), long N, long OC) {
  const long o = get_global_id(0);
  float acc = 0.0f;
  for (long n = 0; n < N; ++n) acc += LOAD(dy, n * OC + o);
  ADD_TO(dbias, o, acc);
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

// ops.h masked_loss_backward: dlosses += mask * scale.
__kernel void masked_loss_backward(__global float* dl, ulong dl_off, __global const float* mask, ulong mask_off,
                                   float scale) {
  const long i = get_global_id(0);
  dl[dl_off + i] += mask[mask_off + i] * scale;
}
