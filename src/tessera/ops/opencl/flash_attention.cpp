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

void flash_attention_forward(Tensor out, Tensor lse, Tensor qkv, int64_t num_groups, const Rope& rope,
                             const Dropout& dropout) {
  const cpu::FlashLayout d = checked_layout(qkv, out, lse, num_groups, rope, dropout, "flash_attention_forward");
  check_floating("flash_attention_forward", {{"out", out}, {"qkv", qkv}});
  ClLaunch launch(out, "flash_attention_forward");
  launch.floats(out).tensor(lse).floats(qkv);
  common_args(launch, d, rope, dropout).run(d.T, d.B * d.NH);
}

void flash_attention_backward(Tensor dqkv, Tensor scratch, Tensor dout, Tensor qkv, Tensor out, Tensor lse,
                              int64_t num_groups, const Rope& rope, const Dropout& dropout) {
  if (dqkv.empty()) return;
  const cpu::FlashLayout d = checked_layout(qkv, out, lse, num_groups, rope, dropout, "flash_attention_backward");
  cpu::check_flash_backward(dqkv, scratch, dout, qkv, out, lse);
  check_floating("flash_attention_backward", {{"dqkv", dqkv}, {"dout", dout}, {"qkv", qkv}, {"out", out}});
  check_f32("flash_attention_backward", {{"scratch", scratch}});
  ClLaunch rows(dout, "flash_attention_backward_rows");
  rows.floats(dqkv).tensor(scratch).floats(dout).floats(qkv).floats(out).tensor(lse);
  common_args(rows, d, rope, dropout).run(d.T, d.B * d.NH);
  ClLaunch keys(dout, "flash_attention_backward_keys");
  keys.floats(dqkv).tensor(scratch).floats(dout).floats(qkv).tensor(lse);
  common_args(keys, d, rope, dropout).run(d.T, d.B * d.NG);
}

// D = rowsum(dout * out) per row, f32.
Shape flash_attention_scratch(const Device&, int64_t B, int64_t NH, int64_t T) { return {B, NH, T}; }

}  // namespace tessera::ops::opencl
