// The host side of the multi-tensor optimizer step (ops.h): the chunk table and the step's
// host-written scalars, shared by every backend.
#include <algorithm>
#include <cmath>

#include "tessera/ops/ops.h"

namespace tessera::ops {

std::vector<int64_t> multi_tensor_chunk_table(const std::vector<MultiTensorSegment>& segments) {
  std::vector<int64_t> table;
  for (const MultiTensorSegment& s : segments) {
    TESSERA_CHECK(s.numel >= 0 && s.main >= 0 && s.param >= 0 && s.grad >= 0 && s.state >= 0 && s.slot >= 0,
                  "multi_tensor_chunk_table: negative offset, size or slot");
    const int64_t chunks = (s.numel + kMultiTensorChunk - 1) / kMultiTensorChunk;
    for (int64_t c = 0; c < chunks; ++c) {
      const int64_t at = c * kMultiTensorChunk;
      const int64_t row[kChunkColumns] = {s.main + at,
                                          s.param + at,
                                          s.grad + at,
                                          s.state + at,
                                          std::min(kMultiTensorChunk, s.numel - at),
                                          s.decay ? 1 : 0,
                                          s.slot,
                                          c == 0 ? chunks : 0};
      table.insert(table.end(), row, row + kChunkColumns);
    }
  }
  return table;
}

// adamw_update's and sgd_update's host arithmetic (ops/cpu/optimizer_updates.cpp,
// ops/kernels/optimizer_updates_host.inc): in double, rounded to float once.
void step_scalars(float out[kGradScale], double lr, double weight_decay, double loss_scale, float beta1,
                  float beta2, int64_t step) {
  TESSERA_CHECK(step >= 1, "step_scalars: step is 1-based");
  const float lr_f = static_cast<float>(lr), wd_f = static_cast<float>(weight_decay);
  const double bc1 = 1.0 - std::pow(static_cast<double>(beta1), static_cast<double>(step));
  const double bc2 = 1.0 - std::pow(static_cast<double>(beta2), static_cast<double>(step));
  out[kLossScale] = static_cast<float>(loss_scale);
  out[kLr] = lr_f;
  out[kWeightDecay] = wd_f;
  out[kAdamDecay] = static_cast<float>(1.0 - static_cast<double>(lr_f) * wd_f);
  out[kAdamStepSize] = static_cast<float>(lr_f / bc1);
  out[kAdamBc2Sqrt] = static_cast<float>(std::sqrt(bc2));
  out[kSgdFirst] = step == 1 ? 1.0f : 0.0f;
}

}  // namespace tessera::ops
