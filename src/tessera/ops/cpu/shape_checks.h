// The sizes of the ops whose shapes take some working out (attention_qkv, flash_attention,
// swiglu, the MoE permutes; ops.h),
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

// attention_kv_pack/unpack's sizes: qkv [B,T,NG*(R+2)*HD] and kv [B,T,NG*2*HD] of one
// floating dtype, not overlapping. kv holds B*T*NG runs of 2*HD elements (a group's k then
// v), run i at element i*(R+2)*HD + R*HD of qkv.
struct KvLayout {
  int64_t runs, R, HD;
  int64_t qkv_offset(int64_t i) const { return i * (R + 2) * HD + R * HD; }
};

inline KvLayout kv_layout(const Tensor& qkv, const Tensor& kv, int64_t num_groups, const char* op) {
  const std::string what = std::string(op) + ": qkv " + shape_str(qkv.shape) + ", kv " + shape_str(kv.shape) +
                           " with " + std::to_string(num_groups) + " query groups";
  TESSERA_CHECK(qkv.ndim() == 3 && kv.ndim() == 3 && qkv.dim(0) == kv.dim(0) && qkv.dim(1) == kv.dim(1) &&
                    num_groups > 0 && kv.dim(2) % (2 * num_groups) == 0 && kv.dim(2) > 0,
                what + ": want qkv [B,T,NG*(NH/NG+2)*HD] and kv [B,T,NG*2*HD]");
  const int64_t HD = kv.dim(2) / (2 * num_groups), R = qkv.dim(2) / (num_groups * HD) - 2;
  TESSERA_CHECK(R >= 1 && num_groups * (R + 2) * HD == qkv.dim(2), what + ": qkv's width is not NG*(R+2)*HD");
  TESSERA_CHECK(qkv.dtype == kv.dtype,
                what + ": qkv is " + std::string(dtype_name(qkv.dtype)) + ", kv " + std::string(dtype_name(kv.dtype)));
  TESSERA_CHECK(!overlap(qkv, kv), what + ": the two tensors overlap");
  return {qkv.dim(0) * qkv.dim(1) * num_groups, R, HD};
}

// flash_attention's sizes (ops.h): qkv [B,T,NG*(R+2)*HD] grouped as attention_qkv's input,
// out [B,T,NH*HD], lse [B,NH,T]; NH from lse, HD from out, R = NH/NG. half = rope.dim / 2.
struct FlashLayout {
  int64_t B, T, NH, NG, R, HD, half;
  int64_t qkv_row() const { return NG * (R + 2) * HD; }
  int64_t out_row() const { return NH * HD; }
  int64_t q_col(int64_t h) const { return (h / R) * (R + 2) * HD + (h % R) * HD; }  // head h's q in a qkv row
  int64_t k_col(int64_t g) const { return g * (R + 2) * HD + R * HD; }              // group g's k
  int64_t v_col(int64_t g) const { return k_col(g) + HD; }
};

inline FlashLayout flash_layout(const Tensor& qkv, const Tensor& out, const Tensor& lse, int64_t num_groups,
                                const Rope& rope, const char* op) {
  const std::string what = std::string(op) + ": qkv " + shape_str(qkv.shape) + ", out " + shape_str(out.shape) +
                           ", lse " + shape_str(lse.shape) + " with " + std::to_string(num_groups) + " query groups";
  const std::string want = ": want qkv [B,T,NG*(NH/NG+2)*HD], out [B,T,NH*HD], lse [B,NH,T]";
  TESSERA_CHECK(qkv.ndim() == 3 && out.ndim() == 3 && lse.ndim() == 3 && num_groups > 0, what + want);
  FlashLayout d{qkv.dim(0), qkv.dim(1), lse.dim(1), num_groups, 0, 0, rope.dim / 2};
  TESSERA_CHECK(d.NH > 0 && d.NH % d.NG == 0 && out.dim(2) % d.NH == 0 && out.dim(0) == d.B && out.dim(1) == d.T &&
                    lse.dim(0) == d.B && lse.dim(2) == d.T,
                what + want);
  d.R = d.NH / d.NG;
  d.HD = out.dim(2) / d.NH;
  TESSERA_CHECK(d.HD > 0 && qkv.dim(2) == d.qkv_row(), what + ": qkv's width is not NG*(NH/NG+2)*HD");
  TESSERA_CHECK(rope.dim >= 0 && rope.dim % 2 == 0 && rope.dim <= d.HD && (rope.dim == 0 || rope.base > 0.0f),
                std::string(op) + ": rope dim " + std::to_string(rope.dim) + " must be even and in [0, " +
                    std::to_string(d.HD) + "] (the head dim), with a positive base");
  TESSERA_CHECK(!overlap(qkv, out), what + ": qkv and out overlap");
  return d;
}

// flash_attention_backward's further arguments, against the forward's.
inline void check_flash_backward(const Tensor& dqkv, const Tensor& dkv, const Tensor& scratch, const Tensor& dout,
                                 const Tensor& qkv, const Tensor& kv, const Tensor& out, const Tensor& lse) {
  TESSERA_CHECK(dkv.empty() == kv.empty() && (dkv.empty() || dkv.shape == qkv.shape),
                "flash_attention_backward: dkv " + shape_str(dkv.shape) + " must be given exactly when kv " +
                    shape_str(kv.shape) + " is, with qkv's shape");
  TESSERA_CHECK(dqkv.shape == qkv.shape && dout.shape == out.shape && scratch.numel() == lse.numel(),
                "flash_attention_backward: dqkv " + shape_str(dqkv.shape) + " for qkv " + shape_str(qkv.shape) +
                    ", dout " + shape_str(dout.shape) + " for out " + shape_str(out.shape) + ", scratch " +
                    shape_str(scratch.shape) + " for lse " + shape_str(lse.shape));
}

// A flash_attention block (ops.h AttentionBlock) against its tensors: kv (empty: qkv) of
// qkv's shape; positions increasing and inside the sequence. Returns it with seq_length
// resolved (0: T).
inline AttentionBlock checked_block(const AttentionBlock& block, const Tensor& qkv, const Tensor& kv, const char* op) {
  AttentionBlock b = block;
  const int64_t T = qkv.dim(1);
  if (b.seq_length == 0) b.seq_length = T;
  TESSERA_CHECK(kv.empty() || kv.shape == qkv.shape,
                std::string(op) + ": kv " + shape_str(kv.shape) + " must have qkv's shape " + shape_str(qkv.shape));
  for (const SequenceRows* r : {&b.queries, &b.keys}) {
    const int64_t split = r->split == 0 ? T : r->split;
    const bool ok = split > 0 && split <= T && r->first >= 0 && r->first + split <= b.seq_length &&
                    (split == T || (r->second >= r->first + split && r->second + (T - split) <= b.seq_length));
    TESSERA_CHECK(ok, std::string(op) + ": rows {split " + std::to_string(r->split) + ", first " +
                          std::to_string(r->first) + ", second " + std::to_string(r->second) + "} of " +
                          std::to_string(T) + " rows do not lie in increasing order inside a sequence of " +
                          std::to_string(b.seq_length));
  }
  return b;
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

// The MoE permutes' token tables: t is [rows, cols].
inline void check_rows(const Tensor& t, int64_t rows, int64_t cols, const char* op, const char* arg) {
  TESSERA_CHECK(t.ndim() == 2 && t.dim(0) == rows && t.dim(1) == cols,
                std::string(op) + ": " + arg + " " + shape_str(t.shape) + ", expected [" + std::to_string(rows) +
                    "," + std::to_string(cols) + "]");
}

// The MoE permutes' row maps: numel int32 entries.
inline void check_map(const Tensor& t, int64_t numel, const char* op, const char* arg) {
  TESSERA_CHECK(t.numel() == numel, std::string(op) + ": " + arg + " " + shape_str(t.shape) + " should have " +
                                        std::to_string(numel) + " elements");
  t.check_dtype(DType::I32);
}

}  // namespace tessera::ops::cpu
