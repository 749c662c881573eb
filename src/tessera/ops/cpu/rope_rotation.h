// Rotary position embedding on the CPU (ops.h Rope): the table of cos and sin per position and
// the rotation of one head, shared by attention_qkv (which rotates while it regroups heads) and
// the fused attention (which rotates its q and k tiles as it loads them), so both rotate alike.
//
// Rotation of a head x by the angles theta_i of position t (i < half = rope.dim / 2):
//   y[i]      = x[i] cos - x[i+half] sin,   y[i+half] = x[i+half] cos + x[i] sin,
// (x cos + rotate_half(x) sin); its transpose is the rotation by -theta (sin negated).
#pragma once

#include <cmath>
#include <cstdint>

#include "tessera/ops/cpu/low_precision.h"
#include "tessera/ops/ops.h"

namespace tessera::ops::cpu {

// cos and sin of theta[t, i] = t * inv_freq[i] (ops.h rope_inv_freq), for t < T and i < half:
// cos at table[t*half + i], sin at table[T*half + t*half + i]. theta is f32 as Megatron
// computes it (fp32 outer product); cos and sin of the f32 angle are evaluated in double and
// rounded once. Computed once per call into the calling thread's Small workspace (valid until
// its next use there); nullptr when half == 0.
inline const float* rope_table(int64_t T, int64_t half, const Rope& rope) {
  if (half == 0) return nullptr;
  const int64_t n = T * half;
  float* table = static_cast<float*>(workspace(Workspace::Small, static_cast<size_t>(2 * n + half) * sizeof(float)));
  float* inv_freq = table + 2 * n;
  for (int64_t i = 0; i < half; ++i) inv_freq[i] = rope_inv_freq(rope, i);
#pragma omp parallel for schedule(static)
  for (int64_t t = 0; t < T; ++t)
    for (int64_t i = 0; i < half; ++i) {
      const double theta = static_cast<float>(t) * inv_freq[i];
      table[t * half + i] = static_cast<float>(std::cos(theta));
      table[n + t * half + i] = static_cast<float>(std::sin(theta));
    }
  return table;
}

// dst[0, HD) = src rotated by the angles of (cs, sn) (sn negated when sign = -1: the
// transpose), channels [2*half, HD) copied; Accumulate adds instead of setting.
template <bool Accumulate>
inline void rotate(float* dst, const float* src, const float* cs, const float* sn, float sign, int64_t half,
                   int64_t HD) {
#pragma omp simd
  for (int64_t i = 0; i < half; ++i) {
    const float c = cs[i], s = sign * sn[i], x1 = src[i], x2 = src[i + half];
    const float y1 = x1 * c - x2 * s, y2 = x2 * c + x1 * s;
    if constexpr (Accumulate) {
      dst[i] += y1;
      dst[i + half] += y2;
    } else {
      dst[i] = y1;
      dst[i + half] = y2;
    }
  }
#pragma omp simd
  for (int64_t i = 2 * half; i < HD; ++i) {
    if constexpr (Accumulate)
      dst[i] += src[i];
    else
      dst[i] = src[i];
  }
}

}  // namespace tessera::ops::cpu
