// The grouped QKV layout to attention's per-head layout, with rotary position embedding on
// q and k (ops.h attention_qkv_forward; Megatron's get_query_key_value_tensors followed by
// rope_utils.py _apply_rotary_pos_emb_bshd, non-interleaved).
// Legend: B batch, T sequence, NG query groups, R = NH/NG query heads per group, NH heads,
// HD head dim, D = rope.dim rotated channels (D/2 angles). qkv, dqkv: [B,T,NG*(R+2)*HD];
// out, dout: [B,T,NH*3*HD]. Any float dtype each, staged by rows of one (b, t) (storage.h).
// attention_kv_pack/unpack: the k and v of each (b, t, group) are one run of 2*HD elements in
// both layouts (shape_checks.h KvLayout), copied whole.
//
// Rotation: rope_rotation.h; the backward is the same code with sin negated.
#include <cmath>
#include <cstring>

#include "tessera/ops/cpu/cpu_ops.h"
#include "tessera/ops/cpu/rope_rotation.h"
#include "tessera/ops/cpu/shape_checks.h"
#include "tessera/ops/cpu/storage.h"

namespace tessera::ops::cpu {

void attention_qkv_forward(Tensor out, Tensor qkv, int64_t num_groups, const Rope& rope) {
  const QkvLayout s = qkv_layout(qkv, out, num_groups, rope, "attention_qkv_forward");
  check_float(out, "attention_qkv_forward", "out");
  check_float(qkv, "attention_qkv_forward", "qkv");
  const float* table = rope_table(s.T, s.half, rope);
  const int64_t HD = s.HD, in_row = s.grouped_row(), out_row = s.per_head_row();
#pragma omp parallel for schedule(static)
  for (int64_t row = 0; row < s.B * s.T; ++row) {
    const int64_t t = row % s.T;
    const float* cs = table ? table + t * s.half : nullptr;
    const float* sn = table ? table + s.T * s.half + t * s.half : nullptr;
    Stage st;
    const float* x = st.in(qkv, row * in_row, in_row);
    float* y = st.out(out, row * out_row, out_row);
    for (int64_t g = 0; g < s.NG; ++g) {
      const float* xg = x + g * (s.R + 2) * HD;  // [q_0 .. q_{R-1}, k, v] of group g
      float* yg = y + g * s.R * 3 * HD;          // heads g*R .. g*R+R-1, [q; k; v] each
      for (int64_t i = 0; i < s.R; ++i) rotate<false>(yg + i * 3 * HD, xg + i * HD, cs, sn, 1.0f, s.half, HD);
      // k rotated once, then copied (with v) to every head of the group.
      rotate<false>(yg + HD, xg + s.R * HD, cs, sn, 1.0f, s.half, HD);
      std::memcpy(yg + 2 * HD, xg + (s.R + 1) * HD, static_cast<size_t>(HD) * sizeof(float));
      for (int64_t i = 1; i < s.R; ++i)
        std::memcpy(yg + i * 3 * HD + HD, yg + HD, static_cast<size_t>(2 * HD) * sizeof(float));
    }
    st.done(out, row * out_row, out_row, y);
  }
}

void attention_qkv_backward(Tensor dqkv, Tensor dout, int64_t num_groups, const Rope& rope) {
  if (dqkv.empty()) return;
  const QkvLayout s = qkv_layout(dqkv, dout, num_groups, rope, "attention_qkv_backward");
  check_float(dqkv, "attention_qkv_backward", "dqkv");
  check_float(dout, "attention_qkv_backward", "dout");
  const float* table = rope_table(s.T, s.half, rope);
  const int64_t HD = s.HD, half = s.half, in_row = s.grouped_row(), out_row = s.per_head_row();
#pragma omp parallel for schedule(static)
  for (int64_t row = 0; row < s.B * s.T; ++row) {
    const int64_t t = row % s.T;
    const float* cs = table ? table + t * half : nullptr;
    const float* sn = table ? table + s.T * half + t * half : nullptr;
    Stage st;
    const float* dy = st.in(dout, row * out_row, out_row);
    float* dx = st.inout(dqkv, row * in_row, in_row);
    for (int64_t g = 0; g < s.NG; ++g) {
      float* dxg = dx + g * (s.R + 2) * HD;
      const float* dyg = dy + g * s.R * 3 * HD;
      float* dk = dxg + s.R * HD;
      float* dv = dk + HD;
      // Each head's dq rotated back; its dk rotated back and its dv added into the group's,
      // in head order (half = 0 rotates nothing: a plain add).
      for (int64_t i = 0; i < s.R; ++i) {
        const float* dh = dyg + i * 3 * HD;
        rotate<true>(dxg + i * HD, dh, cs, sn, -1.0f, half, HD);
        rotate<true>(dk, dh + HD, cs, sn, -1.0f, half, HD);
        rotate<true>(dv, dh + 2 * HD, nullptr, nullptr, 1.0f, 0, HD);
      }
    }
    st.done(dqkv, row * in_row, in_row, dx);
  }
}

void attention_kv_pack(Tensor kv, Tensor qkv, int64_t num_groups) {
  const KvLayout s = kv_layout(qkv, kv, num_groups, "attention_kv_pack");
  check_float(qkv, "attention_kv_pack", "qkv");
  const size_t elem = dtype_size(qkv.dtype), run = static_cast<size_t>(2 * s.HD) * elem;
  const char* src = cpu_memory(qkv);
  char* dst = cpu_memory(kv);
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < s.runs; ++i) std::memcpy(dst + i * run, src + s.qkv_offset(i) * elem, run);
}

void attention_kv_unpack(Tensor qkv, Tensor kv, int64_t num_groups, GradWrite write) {
  const KvLayout s = kv_layout(qkv, kv, num_groups, "attention_kv_unpack");
  check_float(qkv, "attention_kv_unpack", "qkv");
  const int64_t n = 2 * s.HD;
  if (write == GradWrite::Assign) {
    const size_t elem = dtype_size(qkv.dtype), run = static_cast<size_t>(n) * elem;
    const char* src = cpu_memory(kv);
    char* dst = cpu_memory(qkv);
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < s.runs; ++i) std::memcpy(dst + s.qkv_offset(i) * elem, src + i * run, run);
    return;
  }
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < s.runs; ++i) {
    Stage st;
    const float* x = st.in(kv, i * n, n);
    float* y = st.inout(qkv, s.qkv_offset(i), n);
    for (int64_t c = 0; c < n; ++c) y[c] += x[c];
    st.done(qkv, s.qkv_offset(i), n, y);
  }
}

}  // namespace tessera::ops::cpu
