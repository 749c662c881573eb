// RoPE's inverse frequencies (ops.h rope_inv_freq): Megatron's fp32 arange, pow and division
// (RotaryEmbedding.__init__), then _apply_scaling's steps in its order, each rounded to f32
// (compiled without FMA contraction, so that no two of them fuse).
#include <cmath>

#include "tessera/ops/ops.h"

namespace tessera::ops {

float rope_inv_freq(const Rope& rope, int64_t i) {
  const float f = 1.0f / std::pow(rope.base, static_cast<float>(2 * i) / static_cast<float>(rope.dim));
  const RopeScaling& s = rope.scaling;
  if (s.factor == 0.0f) return f;
  const float context = s.original_max_positions, low = s.low_freq_factor, high = s.high_freq_factor;
  const float wavelen = 6.2831855f / f;  // 2 * math.pi as the f32 operand torch divides with
  if (wavelen < context / high) return f;
  if (wavelen > context / low) return f / s.factor;
  const float smooth = (context / wavelen - low) / (high - low);
  return (1.0f - smooth) * f / s.factor + smooth * f;
}

}  // namespace tessera::ops
