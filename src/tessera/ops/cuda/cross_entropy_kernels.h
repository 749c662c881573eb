// The native CUDA kernel of the cross-entropy's backward (cross_entropy_kernels.cu): the
// logits' gradient, typed over the logits' storage dtype, 128-bit loads and stores where the
// rows allow them, element_math.h's cross_entropy_grad (expf; the op is OrderFree).
// cross_entropy.cpp calls it in the default mode where dlogits and logits share a dtype
// (in place or not); --deterministic-mode and mixed dtypes run cross_entropy.cl's kernel.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "tessera/core/dtype.h"

namespace tessera::ops::cuda::native {

struct CrossEntropyGradArgs {
  DType dtype;
  int64_t N, V, vocab_start;  // N rows of V local columns, the shard's first id
  void* dlogits;              // may be logits (the in-place gradient)
  const void* logits;
  const float* dlosses;    // [N]
  const int* targets;      // [N], global ids
  const float* logsumexp;  // [N]
  bool assign;
};

// dlogits[n, v] (+)= softmax(logits[n, :])[v] * dlosses[n] - (v is the target) * dlosses[n].
void cross_entropy_logit_grads(const CrossEntropyGradArgs& a, cudaStream_t stream);

}  // namespace tessera::ops::cuda::native
