// The shape checks of linear_forward and linear_backward (ops.inc), one copy for every
// backend: each runs them before it touches memory, so a wrong shape gets the same error,
// naming the shapes, on the CPU, OpenCL and CUDA.
#pragma once

#include <cstdint>

#include "tessera/core/error.h"
#include "tessera/core/tensor.h"

namespace tessera::ops {

// inp [..., C], weight [OC, C], out [..., OC], bias [OC] or absent.
inline void check_linear_forward_shapes(const Tensor& out, const Tensor& inp, const Tensor& weight,
                                        const Tensor& bias) {
  const int64_t C = inp.dim(-1), N = inp.numel() / C, OC = weight.dim(0);
  TESSERA_CHECK(weight.ndim() == 2 && weight.dim(1) == C && out.numel() == N * OC && out.dim(-1) == OC &&
                    (bias.empty() || bias.numel() == OC),
                "linear: inp " + shape_str(inp.shape) + ", weight " + shape_str(weight.shape) + ", out " +
                    shape_str(out.shape));
}

// The forward's shapes for dout, and each present gradient the size of what it differentiates.
inline void check_linear_backward_shapes(const Tensor& dinp, const Tensor& dweight, const Tensor& dbias,
                                         const Tensor& dout, const Tensor& inp, const Tensor& weight) {
  const int64_t C = inp.dim(-1), N = inp.numel() / C, OC = weight.dim(0);
  TESSERA_CHECK(weight.ndim() == 2 && weight.dim(1) == C && dout.numel() == N * OC && dout.dim(-1) == OC,
                "linear backward: dout " + shape_str(dout.shape) + ", inp " + shape_str(inp.shape) + ", weight " +
                    shape_str(weight.shape));
  TESSERA_CHECK((dinp.empty() || dinp.numel() == N * C) && (dweight.empty() || dweight.numel() == OC * C) &&
                    (dbias.empty() || dbias.numel() == OC),
                "linear backward: gradient shapes");
}

}  // namespace tessera::ops
