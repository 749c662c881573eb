// The affine parameters' gradients of a normalisation over the last dimension, shared by
// LayerNorm and RMSNorm: dweight += sum over rows of dout * xhat, dbias += sum of dout, with
// xhat = (inp - mean) * rstd (mean null: RMSNorm, xhat = inp * rstd). Threads split the
// channels (each owns a column block and sums its rows in order): no atomics, and the same
// bits for any thread count. Either gradient may be empty.
// inp, dout: [N,C] of any float dtype; dweight, dbias: [C]; mean, rstd: f32 [N].
#pragma once

#include <cstdint>

#include "tessera/core/tensor.h"

namespace tessera::ops::cpu {

void norm_affine_grads(Tensor dweight, Tensor dbias, Tensor dout, Tensor inp, const float* mean, const float* rstd);

}  // namespace tessera::ops::cpu
