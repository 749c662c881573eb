// The masked language-model loss around cross-entropy (ops.h masked_loss_sums and its
// backward): reduced on the device so the host reads the sums once per step.
#include <algorithm>

#include "tessera/ops/cpu/cpu_ops.h"
#include "tessera/ops/cpu/storage.h"

namespace tessera::ops::cpu {

void masked_loss_sums(Tensor sums, Tensor losses, Tensor mask) {
  TESSERA_CHECK(sums.numel() == 2 && losses.numel() == mask.numel(),
                "masked_loss_sums: sums " + shape_str(sums.shape) + ", losses " + shape_str(losses.shape) +
                    ", mask " + shape_str(mask.shape));
  const float* loss = f32_arg(losses, "masked_loss_sums", "losses");
  const float* m = f32_arg(mask, "masked_loss_sums", "mask");
  double* s = f64(sums);
  // In index order, in double: the sums do not depend on threads, and every backend
  // adds in this order.
  double loss_sum = 0.0, mask_sum = 0.0;
  for (int64_t i = 0; i < losses.numel(); ++i) {
    loss_sum += static_cast<double>(loss[i]) * m[i];
    mask_sum += m[i];
  }
  s[0] += loss_sum;
  s[1] += mask_sum;
}

void masked_loss_backward(Tensor dlosses, Tensor mask, float scale, GradWrite write) {
  TESSERA_CHECK(dlosses.numel() == mask.numel(), "masked_loss_backward: dlosses " + shape_str(dlosses.shape) +
                                                     ", mask " + shape_str(mask.shape));
  float* dl = f32_arg(dlosses, "masked_loss_backward", "dlosses");
  const float* m = f32_arg(mask, "masked_loss_backward", "mask");
  if (write == GradWrite::Assign) std::fill(dl, dl + dlosses.numel(), 0.0f);
  for (int64_t i = 0; i < dlosses.numel(); ++i) dl[i] += m[i] * scale;
}

}  // namespace tessera::ops::cpu
