// The sizes of the ops whose shapes take some working out (attention_qkv, swiglu; ops.h),
// checked: shared by the CPU kernels and the device backends' host code, so every backend
// accepts and rejects the same calls with the same messages.
#pragma once

#include <cstdint>
#include <string>

#include "tessera/core/error.h"
#include "tessera/core/tensor.h"
#include "tessera/ops/ops.h"

namespace tessera::ops::cpu {

// Whether two tensors share any byte of memory (the same buffer, intersecting ranges).
inline bool overlap(const Tensor& a, const Tensor& b) {
  return !a.empty() && a.device == b.device && a.handle == b.handle && a.offset < b.offset + b.bytes() &&
         b.offset < a.offset + a.bytes();
}

// B batch, T sequence, NG query groups, R = NH/NG query heads per group, HD head dim, half =
// rope.dim / 2 (the rotation angles per position).
struct QkvLayout {
  int64_t B, T, NG, R, HD, half;
  int64_t grouped_row() const { return NG * (R + 2) * HD; }   // qkv's last dim
  int64_t per_head_row() const { return NG * R * 3 * HD; }    // out's last dim
};

// grouped: [B,T,NG*(R+2)*HD] (qkv or dqkv); per_head: [B,T,NH*3*HD] (out or dout). The two
// widths fix HD = (3*grouped - per_head) / (6*NG), then R.
inline QkvLayout qkv_layout(const Tensor& grouped, const Tensor& per_head, int64_t num_groups, const Rope& rope,
                            const char* op) {
  const std::string what = std::string(op) + ": qkv " + shape_str(grouped.shape) + ", out " +
                           shape_str(per_head.shape) + " with " + std::to_string(num_groups) + " query groups";
  TESSERA_CHECK(grouped.ndim() == 3 && per_head.ndim() == 3 && grouped.dim(0) == per_head.dim(0) &&
                    grouped.dim(1) == per_head.dim(1) && num_groups > 0,
                what + ": want qkv [B,T,NG*(NH/NG+2)*HD] and out [B,T,NH*3*HD]");
  TESSERA_CHECK(!overlap(grouped, per_head), what + ": the two tensors overlap");
  const int64_t a = grouped.dim(2), c = per_head.dim(2), six_hd = 3 * a - c;
  TESSERA_CHECK(six_hd > 0 && six_hd % (6 * num_groups) == 0,
                what + ": the widths are not NG*(R+2)*HD and NG*R*3*HD for any head dim HD");
  QkvLayout s{grouped.dim(0), grouped.dim(1), num_groups, 0, six_hd / (6 * num_groups), rope.dim / 2};
  s.R = a / (num_groups * s.HD) - 2;
  TESSERA_CHECK(s.R >= 1 && s.grouped_row() == a && s.per_head_row() == c,
                what + ": the widths are not NG*(R+2)*HD and NG*R*3*HD for any head dim HD");
  TESSERA_CHECK(rope.dim >= 0 && rope.dim % 2 == 0 && rope.dim <= s.HD && (rope.dim == 0 || rope.base > 0.0f),
                std::string(op) + ": rope dim " + std::to_string(rope.dim) + " must be even and in [0, " +
                    std::to_string(s.HD) + "] (the head dim), with a positive base");
  const RopeScaling& k = rope.scaling;
  TESSERA_CHECK(k.factor == 0.0f || (k.factor > 0.0f && k.low_freq_factor > 0.0f &&
                                     k.high_freq_factor > k.low_freq_factor && k.original_max_positions > 0.0f),
                std::string(op) + ": rope scaling factor " + std::to_string(k.factor) + " (0: none) must be >= 0, " +
                    "with 0 < low_freq_factor < high_freq_factor and original_max_positions > 0");
  return s;
}

// F for swiglu's inp [N,2F] (or dinp) and out [N,F] (or dout).
inline int64_t swiglu_width(const Tensor& inp, const Tensor& out, const char* op) {
  const int64_t F = inp.dim(-1) / 2;
  TESSERA_CHECK(F > 0 && inp.dim(-1) % 2 == 0 && out.numel() * 2 == inp.numel() && out.dim(-1) == F,
                std::string(op) + ": inp " + shape_str(inp.shape) + " must be [N,2F] for out [N,F], got out " +
                    shape_str(out.shape));
  TESSERA_CHECK(!overlap(inp, out), std::string(op) + ": inp and out overlap");
  return F;
}

}  // namespace tessera::ops::cpu
