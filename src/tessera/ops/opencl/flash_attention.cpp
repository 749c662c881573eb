// OpenCL's host side of the fused attention (ops/kernels/flash_attention.cl): the forward by
// query rows; the backward by query rows (D into the scratch, dq), then by key rows of each
// group (dk, dv), in the device's in-order queue. Checks as the CPU kernel's (shape_checks.h).
#include <cmath>

#include "tessera/ops/cpu/shape_checks.h"
#include "tessera/ops/kernels/float_args.h"
#include "tessera/ops/opencl/cl_launch.h"
#include "tessera/ops/opencl/opencl_ops.h"

namespace tessera::ops::opencl {
namespace {

constexpr int64_t kMaxHeadDim = 256;  // MAX_HD of attention.cl (the work-items' private rows)

cpu::FlashLayout checked_layout(const Tensor& qkv, const Tensor& out, const Tensor& lse, int64_t num_groups,
                                const Rope& rope, const Dropout& dropout, const char* op) {
  const cpu::FlashLayout d = cpu::flash_layout(qkv, out, lse, num_groups, rope, op);
  TESSERA_CHECK(d.HD <= kMaxHeadDim, std::string(op) + " on OpenCL: head dim " + std::to_string(d.HD) + " above " +
                                         std::to_string(kMaxHeadDim));
  TESSERA_CHECK(dropout.p >= 0.0f && dropout.p < 1.0f, "dropout probability must be in [0, 1)");
  check_f32(op, {{"lse", lse}});
  return d;
}

// The kernels' trailing arguments: sizes, scale, RoPE (attention.cl's ROPE_ARGS), dropout.
ClLaunch& common_args(ClLaunch& launch, const cpu::FlashLayout& d, const Rope& rope, const Dropout& dropout) {
  return launch.scalar<int64_t>(d.T)
      .scalar<int64_t>(d.NH)
      .scalar<int64_t>(d.NG)
      .scalar<int64_t>(d.HD)
      .scalar<float>(1.0f / std::sqrt(static_cast<float>(d.HD)))
      .scalar<int64_t>(d.half)
      .scalar<float>(rope.base)
      .scalar<float>(rope.scaling.factor)
      .scalar<float>(rope.scaling.low_freq_factor)
      .scalar<float>(rope.scaling.high_freq_factor)
      .scalar<float>(rope.scaling.original_max_positions)
      .dropout(dropout);
}

}  // namespace

// The block's positions (flash_attention.cl's POS_ARGS).
ClLaunch& position_args(ClLaunch& launch, const AttentionBlock& block) {
  launch.scalar<int64_t>(block.seq_length);
  for (const SequenceRows* r : {&block.queries, &block.keys})
    launch.scalar<int64_t>(r->split).scalar<int64_t>(r->first).scalar<int64_t>(r->second);
  return launch;
}

void flash_attention_forward(Tensor out, Tensor lse, Tensor qkv, Tensor kv, int64_t num_groups, const Rope& rope,
                             const Dropout& dropout, const AttentionBlock& block_in) {
  const cpu::FlashLayout d = checked_layout(qkv, out, lse, num_groups, rope, dropout, "flash_attention_forward");
  const AttentionBlock block = cpu::checked_block(block_in, qkv, kv, "flash_attention_forward");
  if (kv.empty()) kv = qkv;
  check_floating("flash_attention_forward", {{"out", out}, {"qkv", qkv}, {"kv", kv}});
  ClLaunch launch(out, "flash_attention_forward");
  launch.floats(out).tensor(lse).floats(qkv).floats(kv);
  common_args(launch, d, rope, dropout);
  position_args(launch, block).scalar<int32_t>(block.merge ? 1 : 0).run(d.T, d.B * d.NH);
}

void flash_attention_backward(Tensor dqkv, Tensor dkv, Tensor scratch, Tensor dout, Tensor qkv, Tensor kv, Tensor out,
                              Tensor lse, int64_t num_groups, const Rope& rope, const Dropout& dropout,
                              const AttentionBlock& block_in) {
  if (dqkv.empty()) return;
  const cpu::FlashLayout d = checked_layout(qkv, out, lse, num_groups, rope, dropout, "flash_attention_backward");
  const AttentionBlock block = cpu::checked_block(block_in, qkv, kv, "flash_attention_backward");
  TESSERA_CHECK(!block.merge, "flash_attention_backward: a block is never merged in the backward");
  cpu::check_flash_backward(dqkv, dkv, scratch, dout, qkv, kv, out, lse);
  if (kv.empty()) kv = qkv, dkv = dqkv;
  check_floating("flash_attention_backward",
                 {{"dqkv", dqkv}, {"dkv", dkv}, {"dout", dout}, {"qkv", qkv}, {"kv", kv}, {"out", out}});
  check_f32("flash_attention_backward", {{"scratch", scratch}});
  ClLaunch rows(dout, "flash_attention_backward_rows");
  rows.floats(dqkv).tensor(scratch).floats(dout).floats(qkv).floats(kv).floats(out).tensor(lse);
  common_args(rows, d, rope, dropout);
  position_args(rows, block).run(d.T, d.B * d.NH);
  ClLaunch keys(dout, "flash_attention_backward_keys");
  keys.floats(dkv).tensor(scratch).floats(dout).floats(qkv).floats(kv).tensor(lse);
  common_args(keys, d, rope, dropout);
  position_args(keys, block).run(d.T, d.B * d.NG);
}

// D = rowsum(dout * out) per row, f32.
Shape flash_attention_scratch(const Device&, int64_t B, int64_t NH, int64_t T) { return {B, NH, T}; }

}  // namespace tessera::ops::opencl
