// Vectorisable float math for the CPU kernels. libm's expf/tanhf are opaque scalar calls
// that stop GCC from vectorising a loop (glibc only exposes its SIMD variants under
// -ffast-math), and the softmaxes of attention and of the 50k-wide cross-entropy spend
// most of their time in exp. These are straight-line arithmetic, so a loop calling them
// under `#pragma omp simd` compiles to AVX-512 code.
#pragma once

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>

namespace tessera::ops::cpu {

// exp(x) in float, within 2 ulp of the true value for x in [-87, 88.3] (Cephes' expf
// polynomial after Cody-Waite range reduction). Returns exactly 0 below -87 (where the
// true result is ~1e-38 or subnormal, i.e. 0 next to any softmax sum) and +inf above 88.3
// (the true overflow is at 88.72). NaN propagates to NaN.
// F is float (I int32_t), or a GCC vector of floats (I the int32 vector of its size): the same
// arithmetic lane by lane, for kernels that keep their rows in vector registers.
template <class F, class I>
inline F exp_approx_of(F x) {
  const F lo = F{} - 87.0f, hi = F{} + 88.3f;
  const auto underflow = x < lo;
  const auto overflow = x > hi;
  F xc = x < lo ? lo : x;
  xc = xc > hi ? hi : xc;
  // n = round(x / ln 2): adding 1.5 * 2^23 pushes the fraction bits out of the mantissa,
  // the low bits of the sum then hold n as an integer.
  constexpr float kRound = 12582912.0f;
  const F t = xc * 1.44269504088896341f + kRound;
  const F n = t - kRound;
  const I ni = std::bit_cast<I>(t) - std::bit_cast<int32_t>(kRound);
  // r = x - n ln 2 in two steps (ln 2 = C1 + C2, C1 exact in few bits so n*C1 is exact).
  F r = xc - n * 0.693359375f;
  r = r - n * -2.12194440e-4f;
  // exp(r) on |r| <= ln2/2.
  F p = F{} + 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  const F er = p * r * r + r + 1.0f;
  // 2^n built from its exponent bits; n is in [-126, 127] after the clamps above.
  const F scale = std::bit_cast<F>((ni + 127) << 23);
  F y = er * scale;
  const F zero = F{}, inf = F{} + std::numeric_limits<float>::infinity();
  y = underflow ? zero : y;
  y = overflow ? inf : y;
  return y;
}

inline float exp_approx(float x) { return exp_approx_of<float, int32_t>(x); }

// exp(x) within 1 ulp for x in [-87.3, 88] (measured; Cody-Waite reduction as exp_approx, then
// a degree-6 minimax polynomial of e^r on |r| <= ln2/2): 0 at or below -88 (the true value is
// under 6e-39, nothing next to a softmax sum), saturating at e^88 above 88, NaN to NaN. The
// clamps are the only range handling (2^n with n = -127 is 0 in the exponent bits), so it
// takes ~2/3 of exp_approx's instructions. For the kernels only the default mode runs (flash
// attention, the fused cross-entropy statistics): exp_approx keeps --deterministic-mode's bits.
template <class F, class I>
inline F exp_fast_of(F x) {
  F xc = x < -88.0f ? F{} - 88.0f : x;  // this order keeps NaN
  xc = xc > 88.0f ? F{} + 88.0f : xc;
  constexpr float kRound = 12582912.0f;  // as in exp_approx_of
  const F t = xc * 1.44269504088896341f + kRound;
  const F n = t - kRound;
  const I ni = std::bit_cast<I>(t) - std::bit_cast<int32_t>(kRound);
  F r = xc - n * 0.693359375f;
  r = r - n * -2.12194440e-4f;
  F p = F{} + 1.383684576e-3f;  // minimax coefficients fitted for this reduction
  p = p * r + 8.374815807e-3f;
  p = p * r + 4.166822508e-2f;
  p = p * r + 1.666641980e-1f;
  p = p * r + 4.999999106e-1f;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
  return p * std::bit_cast<F>((ni + 127) << 23);  // n in [-127, 127]
}

inline float exp_fast(float x) { return exp_fast_of<float, int32_t>(x); }

// The logistic function 1 / (1 + exp(-x)), exact limits 0 and 1 at the extremes.
inline float sigmoid_approx(float x) { return 1.0f / (1.0f + exp_approx(-x)); }

// erf(x) to 1.5e-7 absolute (Abramowitz & Stegun 7.1.26): 1 - t P(t) exp(-x^2) with
// t = 1 / (1 + 0.3275911 |x|), odd-extended. The same approximation as PyTorch's
// vectorised CPU erf (Vectorized<float>::erf), which its float GeLU uses.
inline float erf_approx(float x) {
  const float ax = std::fabs(x);
  const float t = 1.0f / (0.3275911f * ax + 1.0f);
  float r = 1.061405429f * t - 1.453152027f;
  r = r * t + 1.421413741f;
  r = r * t - 0.284496736f;
  r = r * t + 0.254829592f;
  const float y = 1.0f - r * t * exp_approx(-x * x);
  return std::copysign(y, x);
}

}  // namespace tessera::ops::cpu
