// CUDA's host side of ops/kernels/elementwise_host.inc, with SwiGLU on the native kernels
// (swiglu_kernels.h) in the default mode where the tensors share a dtype; --deterministic-mode
// (the shared kernels' bits) and mixed dtypes run the shared kernels.
#include <initializer_list>

#include "tessera/ops/cuda/cuda_launch.h"
#include "tessera/ops/cuda/cuda_ops.h"
#include "tessera/ops/cuda/swiglu_kernels.h"

#define TESSERA_BACKEND cuda
#define TESSERA_OWN_SWIGLU
#include "tessera/ops/kernels/elementwise_host.inc"
#undef TESSERA_OWN_SWIGLU
#undef TESSERA_BACKEND

namespace tessera::ops::cuda {
namespace {

// The native kernels serve tensors of one dtype outside --deterministic-mode.
bool native_serves(std::initializer_list<const Tensor*> tensors) {
  const Tensor& first = **tensors.begin();
  if (first.device->deterministic_mode()) return false;
  for (const Tensor* t : tensors)
    if (t->dtype != first.dtype) return false;
  return true;
}

}  // namespace

void swiglu_forward(Tensor out, Tensor inp) {
  if (!native_serves({&out, &inp})) return shared_swiglu_forward(out, inp);
  const int64_t F = cpu::swiglu_width(inp, out, "swiglu_forward");
  check_floating("swiglu_forward", {{"out", out}, {"inp", inp}});
  native::swiglu_forward(out.dtype, memory(out), memory(inp), out.numel() / F, F, stream_of(out));
}

void swiglu_backward(Tensor dinp, Tensor dout, Tensor inp, GradWrite write) {
  if (dinp.empty()) return;
  if (!native_serves({&dinp, &dout, &inp})) return shared_swiglu_backward(dinp, dout, inp, write);
  const int64_t F = cpu::swiglu_width(inp, dout, "swiglu_backward");
  TESSERA_CHECK(dinp.numel() == inp.numel(),
                "swiglu_backward: dinp " + shape_str(dinp.shape) + " vs inp " + shape_str(inp.shape));
  check_floating("swiglu_backward", {{"dinp", dinp}, {"dout", dout}, {"inp", inp}});
  native::swiglu_backward(dinp.dtype, memory(dinp), memory(dout), memory(inp), dout.numel() / F, F,
                          write == GradWrite::Assign, stream_of(dinp));
}

}  // namespace tessera::ops::cuda
