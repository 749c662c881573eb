// Dropout with counter-based masks (see dropout_mask.h and ops.h's Dropout). Nothing is
// stored between forward and backward: the backward draws the same mask again, which costs
// one Philox call per 4 elements and saves a [B,...] mask buffer per dropout site.
#include <algorithm>
#include <cmath>
#include <cstring>

#if defined(__AVX512F__)
#include <immintrin.h>
#endif

#include "tessera/core/rng.h"
#include "tessera/ops/cpu/cpu_ops.h"
#include "tessera/ops/cpu/dropout_mask.h"
#include "tessera/ops/cpu/storage.h"

namespace tessera::ops::cpu {
namespace {

// Philox calls per batch in dropout_factors: 4 * kGroups elements.
constexpr int kGroups = 64;

constexpr uint32_t kM0 = 0xD2511F53u, kM1 = 0xCD9E8D57u;
constexpr uint32_t kW0 = 0x9E3779B9u, kW1 = 0xBB67AE85u;

#if defined(__AVX512F__)
// The high and low halves of the 32x32->64 products m * x in 16 lanes: VPMULUDQ on the even
// lanes and on the odd ones shifted down (GCC vectorises the plain loop below with VPMULLQ,
// a 64-bit multiply of three times the cost, when it targets AVX-512).
// (The zero-masked forms with every lane on: GCC 12's unmasked ones start from
// _mm512_undefined and warn -Wmaybe-uninitialized.)
inline void mul_hi_lo(__m512i m, __m512i x, __m512i& hi, __m512i& lo) {
  constexpr __mmask8 kAll = 0xFF;
  const __m512i even = _mm512_maskz_mul_epu32(kAll, m, x);
  const __m512i odd = _mm512_maskz_mul_epu32(kAll, m, _mm512_maskz_srli_epi64(kAll, x, 32));
  hi = _mm512_mask_blend_epi32(0xAAAA, _mm512_maskz_srli_epi64(kAll, even, 32), odd);
  lo = _mm512_mask_blend_epi32(0xAAAA, even, _mm512_maskz_slli_epi64(kAll, odd, 32));
}

// Ten rounds over 16 counters at x0[0..16), ... (philox_batch's loop body, in registers).
void philox_rounds16(uint32_t key0, uint32_t key1, uint32_t* x0, uint32_t* x1, uint32_t* x2, uint32_t* x3) {
  __m512i a = _mm512_loadu_si512(x0), b = _mm512_loadu_si512(x1), c = _mm512_loadu_si512(x2),
          d = _mm512_loadu_si512(x3);
  const __m512i m0 = _mm512_set1_epi32(static_cast<int>(kM0)), m1 = _mm512_set1_epi32(static_cast<int>(kM1));
  for (int round = 0; round < 10; ++round) {
    __m512i hi0, lo0, hi1, lo1;
    mul_hi_lo(m0, a, hi0, lo0);
    mul_hi_lo(m1, c, hi1, lo1);
    a = _mm512_xor_si512(_mm512_xor_si512(hi1, b), _mm512_set1_epi32(static_cast<int>(key0)));
    b = lo1;
    c = _mm512_xor_si512(_mm512_xor_si512(hi0, d), _mm512_set1_epi32(static_cast<int>(key1)));
    d = lo0;
    key0 += kW0;
    key1 += kW1;
  }
  _mm512_storeu_si512(x0, a);
  _mm512_storeu_si512(x1, b);
  _mm512_storeu_si512(x2, c);
  _mm512_storeu_si512(x3, d);
}
#endif

// Philox4x32-10 for the counters {c0 + g, c1, c2, c3}, g < n, lanes interleaved into
// out[4*g + lane]. The same rounds as core/rng.h's philox4x32, written across an array of
// counters (structure of arrays) so that the 32x32->64 multiplies vectorise: ~10x faster
// than one scalar call at a time.
void philox_batch(uint32_t key0, uint32_t key1, uint32_t c0, uint32_t c1, uint32_t c2, uint32_t c3, int n,
                  uint32_t* out) {
  uint32_t x0[kGroups], x1[kGroups], x2[kGroups], x3[kGroups];
  for (int g = 0; g < n; ++g) {
    x0[g] = c0 + static_cast<uint32_t>(g);
    x1[g] = c1;
    x2[g] = c2;
    x3[g] = c3;
  }
  int g0 = 0;
#if defined(__AVX512F__)
  for (; g0 + 16 <= n; g0 += 16) philox_rounds16(key0, key1, x0 + g0, x1 + g0, x2 + g0, x3 + g0);
#endif
  for (int round = 0; round < 10; ++round) {
#pragma omp simd
    for (int g = g0; g < n; ++g) {
      const uint64_t p0 = static_cast<uint64_t>(kM0) * x0[g];
      const uint64_t p1 = static_cast<uint64_t>(kM1) * x2[g];
      const uint32_t y0 = static_cast<uint32_t>(p1 >> 32) ^ x1[g] ^ key0;
      const uint32_t y2 = static_cast<uint32_t>(p0 >> 32) ^ x3[g] ^ key1;
      x0[g] = y0;
      x1[g] = static_cast<uint32_t>(p1);
      x2[g] = y2;
      x3[g] = static_cast<uint32_t>(p0);
    }
    key0 += kW0;
    key1 += kW1;
  }
  for (int g = 0; g < n; ++g) {
    out[4 * g + 0] = x0[g];
    out[4 * g + 1] = x1[g];
    out[4 * g + 2] = x2[g];
    out[4 * g + 3] = x3[g];
  }
}

// Elements per parallel work item of dropout_forward/backward (a multiple of 4 so chunks
// start on a Philox group when element_offset does).
constexpr int64_t kChunk = 4096;

int64_t batch_dim(const Tensor& t) {
  TESSERA_CHECK(t.ndim() >= 1 && t.dim(0) > 0, "dropout needs a leading batch dimension, got " + shape_str(t.shape));
  return t.dim(0);
}

}  // namespace

float dropout_scale(const Dropout& dropout) {
  TESSERA_CHECK(dropout.p >= 0.0f && dropout.p < 1.0f, "dropout probability must be in [0, 1)");
  return 1.0f / (1.0f - dropout.p);
}

uint32_t dropout_iteration(const Dropout& dropout) {
  if (dropout.iteration.empty()) return dropout.key.iteration;
  check_dropout_iteration(dropout, *dropout.iteration.device);
  return static_cast<uint32_t>(*i32(dropout.iteration));
}

void dropout_factors(const Dropout& dropout, int64_t b, uint64_t first, int64_t count, float* factors) {
  const float p = dropout.p;
  const uint32_t iteration = dropout_iteration(dropout);
  const float scale = dropout_scale(dropout);
  const uint32_t key0 = dropout.key.seed, key1 = static_cast<uint32_t>(RngStream::Dropout);
  const uint32_t c1 = dropout.sample0 + static_cast<uint32_t>(b);
  uint32_t lanes[4 * kGroups];
  int64_t i = 0;
  while (i < count) {
    const uint64_t index = dropout.element_offset + first + static_cast<uint64_t>(i);
    const int lane0 = static_cast<int>(index % 4);
    const int64_t n = std::min<int64_t>(count - i, 4 * kGroups - lane0);
    philox_batch(key0, key1, static_cast<uint32_t>(index / 4), c1, dropout.key.site, iteration,
                 static_cast<int>((lane0 + n + 3) / 4), lanes);
    const uint32_t* u = lanes + lane0;
    float* f = factors + i;
#pragma omp simd
    for (int64_t j = 0; j < n; ++j) f[j] = uint_to_unit_float(u[j]) >= p ? scale : 0.0f;
    i += n;
  }
}

namespace {

// out = dy * factor (forward: y = x * factor) or dx += dy * factor (backward, written per
// `write`) for the chunks of every sample, in any float dtypes; the factors of p == 0 are
// all 1.
void apply_mask(const Tensor& out, const Tensor& inp, const Dropout& dropout, bool accumulate,
                GradWrite write = GradWrite::Accumulate) {
  const int64_t n = inp.numel();
  const bool drop = dropout.p != 0.0f;  // 0: disabled (evaluation, or --*-dropout 0)
  if (drop) dropout_scale(dropout);     // checks p
  const int64_t B = drop ? batch_dim(inp) : 1, S = n / B;
  const int64_t chunks = (S + kChunk - 1) / kChunk;
#pragma omp parallel for schedule(static)
  for (int64_t w = 0; w < B * chunks; ++w) {
    const int64_t b = w / chunks, e0 = (w % chunks) * kChunk, len = std::min(kChunk, S - e0), off = b * S + e0;
    Stage s;
    const float* x = s.in(inp, off, len);
    float* y = accumulate ? s.grad(out, off, len, write) : s.out(out, off, len);
    if (!drop) {
      if (accumulate) {
#pragma omp simd
        for (int64_t i = 0; i < len; ++i) y[i] += x[i];
      } else if (y != x) {
        std::memmove(y, x, static_cast<size_t>(len) * sizeof(float));
      }
    } else {
      float factors[kChunk];
      dropout_factors(dropout, b, static_cast<uint64_t>(e0), len, factors);
      if (accumulate) {
        // One fused multiply-add, written out: the device kernels do the same, so the bits
        // do not depend on whether a compiler contracts y + x * f (nvcc --fmad=false does not).
#pragma omp simd
        for (int64_t i = 0; i < len; ++i) y[i] = std::fma(x[i], factors[i], y[i]);
      } else {
#pragma omp simd
        for (int64_t i = 0; i < len; ++i) y[i] = x[i] * factors[i];
      }
    }
    s.done(out, off, len, y);
  }
}

}  // namespace

void dropout_forward(Tensor out, Tensor inp, const Dropout& dropout) {
  TESSERA_CHECK(out.numel() == inp.numel(), "dropout: out " + shape_str(out.shape) + " vs inp " + shape_str(inp.shape));
  check_float(out, "dropout_forward", "out");
  check_float(inp, "dropout_forward", "inp");
  apply_mask(out, inp, dropout, false);
}

void dropout_backward(Tensor dinp, Tensor dout, const Dropout& dropout, GradWrite write) {
  if (dinp.empty()) return;
  TESSERA_CHECK(dinp.numel() == dout.numel(), "dropout: dinp " + shape_str(dinp.shape) + " vs dout " + shape_str(dout.shape));
  check_float(dinp, "dropout_backward", "dinp");
  check_float(dout, "dropout_backward", "dout");
  apply_mask(dinp, dout, dropout, true, write);
}

}  // namespace tessera::ops::cpu
