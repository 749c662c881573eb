// CUDA's host side of ops/kernels/cross_entropy_host.inc, with its own row-statistics
// kernels (row_kernels.cuh): cross_entropy_max and cross_entropy_sums a row per warp of
// 32 threads (launched over 32 * N work-items), each lane one of the CPU's 32 partial sums.
// In the default mode the backward runs the native typed kernel (cross_entropy_kernels.h)
// where dlogits and logits share a dtype; --deterministic-mode keeps cross_entropy.cl's.
#include "tessera/ops/cuda/cross_entropy_kernels.h"
#include "tessera/ops/cuda/cuda_launch.h"
#include "tessera/ops/cuda/cuda_ops.h"

namespace tessera::ops::cuda {
namespace {

bool native_cross_entropy_backward(const Tensor& dlogits, const Tensor& dlosses, const Tensor& logits,
                                   const Tensor& targets, const Tensor& logsumexp, int64_t shard_start,
                                   GradWrite write) {
  if (logits.device->deterministic_mode() || dlogits.dtype != logits.dtype) return false;
  const int64_t V = logits.dim(-1);
  const native::CrossEntropyGradArgs a{logits.dtype,
                                       logits.numel() / V,
                                       V,
                                       shard_start,
                                       memory<void>(dlogits),
                                       memory<const void>(logits),
                                       memory<const float>(dlosses),
                                       memory<const int>(targets),
                                       memory<const float>(logsumexp),
                                       write == GradWrite::Assign};
  native::cross_entropy_logit_grads(a, stream_of(logits));
  return true;
}

}  // namespace
}  // namespace tessera::ops::cuda

#define TESSERA_BACKEND cuda
#define TESSERA_CROSS_ENTROPY_ROW_KERNEL(name) name "_rows"
#define TESSERA_CROSS_ENTROPY_ROW_ITEMS(N) (32 * (N))  // row_kernels.cuh's ROW_LANES
#define TESSERA_NATIVE_CROSS_ENTROPY_GRAD
#include "tessera/ops/kernels/cross_entropy_host.inc"
#undef TESSERA_NATIVE_CROSS_ENTROPY_GRAD
#undef TESSERA_CROSS_ENTROPY_ROW_ITEMS
#undef TESSERA_CROSS_ENTROPY_ROW_KERNEL
#undef TESSERA_BACKEND
