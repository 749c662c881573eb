// The work items of CUDA's native attention_qkv kernels (rope_kernels.cu): the grouped QKV layout
// to the per-head one with RoPE on q and k, and back (ops.inc attention_qkv_*), as C++ that nvcc
// (device code) and the host compiler both read, so the CPU tests run every item against
// ops/cpu/attention_qkv.cpp (tests/unit/ops/cuda_element_math_test.cpp).
//
// Legend as attention_qkv.cpp's: NG query groups, R query heads per group, HD head dim, half =
// rope.dim / 2 angles. A grouped row holds per group [q_0 .. q_{R-1}, k, v] (R + 2 slots of HD);
// a per-head row holds per head h = g*R + i [q_h, k_g, v_g].
//
// One item is (row, group g, slot s < R + 2, pair j < ceil(HD / 2)): for j < half the rotated
// pair of channels (j, j + half), else the plain channels 2j and 2j + 1 (those below HD). So
// one item reads each input once and a k or v slot is written to (forward) or summed from
// (backward) its R heads in head order, as the CPU does. Angles as the CPU's rope_table: the
// f32 angle t * inv_freq[i] (inv_freq: ops.h rope_inv_freq, the host's, passed in), its cos and
// sin in double, rounded once; the rotation as rope_rotation.h's (sin times -1: the transpose).
#pragma once

#include <math.h>
#include <stdint.h>

#include "tessera/ops/cuda/host_device.h"

namespace tessera::ops::cuda::native {

struct QkvShape {
  int64_t T, NG, R, HD, half;
  TESSERA_HD int64_t grouped_row() const { return NG * (R + 2) * HD; }
  TESSERA_HD int64_t per_head_row() const { return NG * R * 3 * HD; }
  TESSERA_HD int64_t pairs() const { return (HD + 1) / 2; }  // items per slot
};

// RoPE's inverse frequencies for up to kMaxRopeAngles angles (head dims up to 512), by value:
// computed once on the host by ops.h's rope_inv_freq, the function the CPU uses.
constexpr int kMaxRopeAngles = 256;
struct RopeFreqs {
  float inv_freq[kMaxRopeAngles];
};

struct CosSin {
  float cos, sin;
};
TESSERA_HD CosSin rope_cos_sin(int64_t t, float inv_freq) {
  const double theta = static_cast<float>(t) * inv_freq;
  return {static_cast<float>(::cos(theta)), static_cast<float>(::sin(theta))};
}

// The pair (x1, x2) = (x[i], x[i + half]) rotated by the angle (sign -1: by its negative).
struct Pair {
  float a, b;
};
TESSERA_HD Pair rope_rotate(float x1, float x2, CosSin cs, float sign) {
  const float c = cs.cos, s = sign * cs.sin;
  return {x1 * c - x2 * s, x2 * c + x1 * s};
}

// The two channels of item j of a head and whether the second exists.
struct ItemChannels {
  int64_t c1, c2;
  bool rotated, has_c2;
};
TESSERA_HD ItemChannels item_channels(const QkvShape& s, int64_t j) {
  if (j < s.half) return {j, j + s.half, true, true};
  return {2 * j, 2 * j + 1, false, 2 * j + 1 < s.HD};
}

// Forward item: reads qkv (load(i) -> float at element i), writes out (store(i, v)).
template <class Load, class Store>
TESSERA_HD void qkv_forward_item(const QkvShape& s, const float* inv_freq, int64_t row, int64_t g, int64_t slot,
                                 int64_t j, const Load& load, const Store& store) {
  const ItemChannels ch = item_channels(s, j);
  const int64_t in = row * s.grouped_row() + (g * (s.R + 2) + slot) * s.HD;
  Pair y{load(in + ch.c1), ch.has_c2 ? load(in + ch.c2) : 0.0f};
  if (ch.rotated && slot <= s.R) y = rope_rotate(y.a, y.b, rope_cos_sin(row % s.T, inv_freq[j]), 1.0f);
  const int64_t heads = row * s.per_head_row() + g * s.R * 3 * s.HD;  // head g*R's [q; k; v]
  // q_slot goes to its head's q; k (slot R) and v (R + 1) to every head of the group.
  const int64_t first = slot < s.R ? slot : 0, last = slot < s.R ? slot + 1 : s.R;
  const int64_t part = slot < s.R ? 0 : slot - s.R + 1;
  for (int64_t h = first; h < last; ++h) {
    const int64_t o = heads + h * 3 * s.HD + part * s.HD;
    store(o + ch.c1, y.a);
    if (ch.has_c2) store(o + ch.c2, y.b);
  }
}

// Backward item: dqkv (load_dqkv / store_dqkv) += the transpose of the forward from dout
// (load_dout), the heads of a k or v slot added in head order onto dqkv's value, rounded once.
template <class LoadOut, class LoadIn, class Store>
TESSERA_HD void qkv_backward_item(const QkvShape& s, const float* inv_freq, int64_t row, int64_t g, int64_t slot,
                                  int64_t j, const LoadOut& load_dout, const LoadIn& load_dqkv, const Store& store_dqkv) {
  const ItemChannels ch = item_channels(s, j);
  const int64_t in = row * s.grouped_row() + (g * (s.R + 2) + slot) * s.HD;
  const bool rotated = ch.rotated && slot <= s.R;
  const CosSin cs = rotated ? rope_cos_sin(row % s.T, inv_freq[j]) : CosSin{1.0f, 0.0f};
  Pair acc{load_dqkv(in + ch.c1), ch.has_c2 ? load_dqkv(in + ch.c2) : 0.0f};
  const int64_t heads = row * s.per_head_row() + g * s.R * 3 * s.HD;
  const int64_t first = slot < s.R ? slot : 0, last = slot < s.R ? slot + 1 : s.R;
  const int64_t part = slot < s.R ? 0 : slot - s.R + 1;
  for (int64_t h = first; h < last; ++h) {
    const int64_t o = heads + h * 3 * s.HD + part * s.HD;
    Pair d{load_dout(o + ch.c1), ch.has_c2 ? load_dout(o + ch.c2) : 0.0f};
    if (rotated) d = rope_rotate(d.a, d.b, cs, -1.0f);
    acc.a += d.a;
    acc.b += d.b;
  }
  store_dqkv(in + ch.c1, acc.a);
  if (ch.has_c2) store_dqkv(in + ch.c2, acc.b);
}

}  // namespace tessera::ops::cuda::native
