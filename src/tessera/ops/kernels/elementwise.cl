// Element-wise kernels: residual, GeLU, dropout, bias, scaling (ops/cpu/residual.cpp,
// gelu.cpp, dropout.cpp, linear.cpp's bias_add, reductions.cpp's scale_inplace). One
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

__kernel void dropout_backward(FLOATS(dinp), CONST_FLOATS(dout), long S, DROPOUT_PARAMS) {
  DROPOUT_GROUPS_BODY(ADD_TO(dinp, i, LOAD(dout, i) * factor))
}

// out[n, o] = inp[n, o] + bias[o] (just inp[n, o] when bias is absent) over a block of
// rows with leading dimensions ld_out and ld_inp: bias_add_forward, and the block copies
// (widening, rounding, adding the bias) of the 16-bit linear. Work-item (o, n).
__kernel void rows_plus_bias(FLOATS(out), long ld_out, CONST_FLOATS(inp), long ld_inp, CONST_FLOATS(bias)) {
  const long o = get_global_id(0), n = get_global_id(1);
  const float v = LOAD(inp, n * ld_inp + o);
  STORE(out, n * ld_out + o, bias ? v + LOAD(bias, o) : v);
}

// out[n, o] = bias[o], rounded to half when round_half (the FP16 linear's bias operand).
__kernel void broadcast_bias(FLOATS(out), CONST_FLOATS(bias), long OC, int round_half) {
  const long o = get_global_id(0), n = get_global_id(1);
  const float b = LOAD(bias, o);
  STORE(out, n * OC + o, round_half ? round_fp16(b) : b);
}

// dbias[o] += column sum of dy[N, OC] (rounded to half when round_half: the FP16
// linear's dbias contribution); one work-item per column, rows in order.
__kernel void column_sums(FLOATS(dbias), CONST_FLOATS(dy), long N, long OC, int round_half) {
  const long o = get_global_id(0);
  float acc = 0.0f;
  for (long n = 0; n < N; ++n) acc += LOAD(dy, n * OC + o);
  ADD_TO(dbias, o, round_half ? round_fp16(acc) : acc);
}

// The low-precision linear's operands: dst = round(src) for a rows x cols block with
// leading dimension ld (dst contiguous). mode: 1 bfloat16, 2 half.
__kernel void round_block(__global float* dst, __global const float* src, ulong src_off, long cols, long ld,
                          int mode) {
  const long c = get_global_id(0), r = get_global_id(1);
  const float v = src[src_off + r * ld + c];
  dst[r * cols + c] = mode == 1 ? round_bf16(v) : round_fp16(v);
}

// dst += round_fp16(src): an FP16 contribution accumulated into an f32 gradient.
__kernel void add_rounded_fp16(__global float* dst, ulong dst_off, __global const float* src) {
  const long i = get_global_id(0);
  dst[dst_off + i] += round_fp16(src[i]);
}

// In-place round to half (the FP16 linear's output).
__kernel void round_fp16_inplace(__global float* x, ulong x_off) {
  const long i = get_global_id(0);
  x[x_off + i] = round_fp16(x[x_off + i]);
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
