// The floating dtypes of tensors in kernels (prepended to every program, after the
// prelude): ops.h lets each floating tensor be F32, BF16 or F16. A kernel takes such a
// tensor as FLOATS(name) / CONST_FLOATS(name), a pointer, an offset in elements and a
// dtype code (the host passes all three, Launch::floats), and reaches it only through
// LOAD / STORE / ADD_TO below: each element is widened exactly to f32 on load and each
// stored value is rounded once to the tensor's dtype, so one kernel body serves every
// dtype. The roundings are the CPU's, bit for bit (core/dtype.h, ops/cpu/low_precision.h).
// The branch on the dtype is the same for every work-item of a launch.

// The codes: core/dtype.h's DType values (ops/kernels/float_args.h checks they agree).
#define DT_F32 0
#define DT_BF16 1
#define DT_F16 2

// The bfloat16 nearest to x (round-to-nearest-even, NaN quieted), as its 16 bits:
// core/dtype.h's f32_to_bf16.
DEVICE_FN uint bf16_bits(float x) {
  uint u = as_uint(x);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (u >> 16) | 0x40u;
  u += 0x7fffu + ((u >> 16) & 1u);
  return u >> 16;
}

// The IEEE half nearest to x (round-to-nearest-even; >= 65520 in magnitude is inf; NaN
// quieted), as its 16 bits: low_precision.h's fp16_bits.
DEVICE_FN uint fp16_bits(float x) {
  const uint u = as_uint(x);
  const uint sign = (u >> 16) & 0x8000u, a = u & 0x7FFFFFFFu;
  if (a > 0x7F800000u) return sign | 0x7E00u | ((a >> 13) & 0x3FFu);
  if (a >= 0x477FF000u) return sign | 0x7C00u;
  if (a >= 0x38800000u) {
    const uint r = a - 0x38000000u;
    return sign | ((r + 0xFFFu + ((r >> 13) & 1u)) >> 13);
  }
  if (a <= 0x33000000u) return sign;
  const uint e = a >> 23, m = (a & 0x7FFFFFu) | 0x800000u, shift = 126 - e;
  uint q = m >> shift;
  const uint rem = m & ((1u << shift) - 1), halfway = 1u << (shift - 1);
  if (rem > halfway || (rem == halfway && (q & 1u))) ++q;
  return sign | q;
}

// The value of the half with bits h, as f32 (exact): low_precision.h's fp16_to_f32.
DEVICE_FN float fp16_to_f32(uint h) {
  const uint hs = (h & 0x8000u) << 16, e = (h >> 10) & 0x1Fu, m = h & 0x3FFu;
  if (e == 0x1F) return as_float(hs | 0x7F800000u | (m << 13) | (m ? 0x400000u : 0u));
  if (e == 0) {
    const float v = (float)m * 0x1p-24f;
    return hs ? -v : v;
  }
  return as_float(hs | ((e + 112) << 23) | (m << 13));
}

// Element i of a floating tensor at p with dtype code dt, as f32 (exact).
DEVICE_FN float load_float(__global const void* p, ulong i, int dt) {
  if (dt == DT_F32) return ((__global const float*)p)[i];
  const uint h = ((__global const ushort*)p)[i];
  return dt == DT_BF16 ? as_float(h << 16) : fp16_to_f32(h);
}

// Stores v into element i, rounded once to the dtype.
DEVICE_FN void store_float(__global void* p, ulong i, int dt, float v) {
  if (dt == DT_F32)
    ((__global float*)p)[i] = v;
  else
    ((__global ushort*)p)[i] = (ushort)(dt == DT_BF16 ? bf16_bits(v) : fp16_bits(v));
}

// v rounded once to dtype code dt (f32: v itself).
DEVICE_FN float round_to(float v, int dt) {
  if (dt == DT_F32) return v;
  return dt == DT_BF16 ? as_float(bf16_bits(v) << 16) : fp16_to_f32(fp16_bits(v));
}

#define FLOATS(name) __global void* name, ulong name##_off, int name##_dt
#define CONST_FLOATS(name) __global const void* name, ulong name##_off, int name##_dt
// Element i (counted from the tensor's offset) of a FLOATS argument.
#define LOAD(name, i) load_float(name, name##_off + (ulong)(i), name##_dt)
#define STORE(name, i, v) store_float(name, name##_off + (ulong)(i), name##_dt, (v))
// An accumulating output: read, add in f32, round once.
#define ADD_TO(name, i, v) STORE(name, i, LOAD(name, i) + (v))
// A gradient output written per ops.h's GradWrite (assign: 1 for Assign): added to its
// value, or to 0 without reading it (the bits of accumulating into a zeroed tensor).
#define GRAD_TO(name, i, v, assign) STORE(name, i, ((assign) ? 0.0f : LOAD(name, i)) + (v))
