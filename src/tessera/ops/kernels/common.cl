// Shared by every tessera kernel (prepended to each program, after dtype.cl): the CPU
// backend's float approximations (ops/cpu/fast_math.h), written op for op so both
// backends compute the same functions, and the counter-based Philox RNG of core/rng.h
// with ops.h's dropout mask.
//
// Conventions of every kernel: a tensor is passed as (pointer, offset in elements), a
// floating one also with its dtype code (dtype.cl); an absent optional tensor is a null
// pointer. Sizes are long (64-bit) so no index overflows.

// exp(x): fast_math.h's exp_approx (Cephes' expf polynomial after Cody-Waite reduction),
// exactly 0 below -87 and +inf above 88.3; NaN propagates.
DEVICE_FN float exp_approx(float x) {
  const bool underflow = x < -87.0f;
  const bool overflow = x > 88.3f;
  float xc = x < -87.0f ? -87.0f : x;
  xc = xc > 88.3f ? 88.3f : xc;
  const float kRound = 12582912.0f;  // 1.5 * 2^23: rounds x / ln2 to an integer
  const float t = xc * 1.44269504088896341f + kRound;
  const float n = t - kRound;
  const int ni = as_int(t) - as_int(kRound);
  float r = xc - n * 0.693359375f;
  r = r - n * -2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  const float er = p * r * r + r + 1.0f;
  float y = er * as_float((ni + 127) << 23);
  y = underflow ? 0.0f : y;
  y = overflow ? INFINITY : y;
  return y;
}

DEVICE_FN float sigmoid_approx(float x) { return 1.0f / (1.0f + exp_approx(-x)); }

// erf(x) to 1.5e-7 absolute (Abramowitz & Stegun 7.1.26), as fast_math.h's erf_approx.
DEVICE_FN float erf_approx(float x) {
  const float ax = fabs(x);
  const float t = 1.0f / (0.3275911f * ax + 1.0f);
  float r = 1.061405429f * t - 1.453152027f;
  r = r * t + 1.421413741f;
  r = r * t - 0.284496736f;
  r = r * t + 0.254829592f;
  const float y = 1.0f - r * t * exp_approx(-x * x);
  return copysign(y, x);
}

// Philox4x32-10 from core/philox.h, the source the CPU kernels compile (the OpenCL program
// has it prepended; CUDA includes it here), on uint4 counters.
#ifdef __CUDACC__
#include "tessera/core/philox.h"
#endif
DEVICE_FN uint4 philox4x32(uint key0, uint key1, uint4 ctr) {
  tessera_philox4 c;
  c.v[0] = ctr.x;
  c.v[1] = ctr.y;
  c.v[2] = ctr.z;
  c.v[3] = ctr.w;
  const tessera_philox4 r = tessera_philox4x32(key0, key1, c);
  return make_uint4(r.v[0], r.v[1], r.v[2], r.v[3]);
}

DEVICE_FN float uint_to_unit_float(uint x) { return tessera_uint_to_unit_float(x); }

// ops.h's Dropout as kernel arguments, in this order (host: the launchers' dropout()). The
// iteration is drop_counter's element when the host passed one (Dropout::iteration, a device
// scalar), else drop_iteration.
#define DROPOUT_PARAMS float drop_p, float drop_scale, uint drop_seed, uint drop_site, uint drop_iteration, \
                       __global const uint* drop_counter, ulong drop_counter_off, uint drop_sample0,      \
                       ulong drop_element_offset
#define DROP_ITERATION (drop_counter ? drop_counter[drop_counter_off] : drop_iteration)
#define RNG_STREAM_DROPOUT TESSERA_RNG_STREAM_DROPOUT

// The factor of element `element` (within this shard's per-sample tensor) of batch sample
// b: 1/(1-p) if kept, 0 if dropped (ops/cpu/dropout_mask.h).
DEVICE_FN float dropout_factor(float drop_p, float drop_scale, uint drop_seed, uint drop_site, uint drop_iteration,
                     uint drop_sample0, ulong drop_element_offset, long b, ulong element) {
  const ulong index = drop_element_offset + element;
  const uint4 r = philox4x32(drop_seed, RNG_STREAM_DROPOUT,
                             make_uint4((uint)(index / 4), drop_sample0 + (uint)b, drop_site, drop_iteration));
  const uint lane = (uint)(index % 4);
  const uint bits = lane == 0 ? r.x : lane == 1 ? r.y : lane == 2 ? r.z : r.w;
  return uint_to_unit_float(bits) >= drop_p ? drop_scale : 0.0f;
}
#define DROPOUT_FACTOR(b, element) \
  dropout_factor(drop_p, drop_scale, drop_seed, drop_site, DROP_ITERATION, drop_sample0, drop_element_offset, b, element)
