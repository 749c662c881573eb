// CUDA's mixture-of-experts row movement: the native kernels (moe_kernels.h) where the tensors
// share a dtype, else the shared moe.cl kernels (ops/kernels/moe_host.inc, OpenCL's too). The
// grouped GEMM is not here: the model runs one cuBLASLt linear per expert (MoELayer's
// grouped_forward), as on OpenCL.
#include "tessera/ops/cuda/cuda_launch.h"
#include "tessera/ops/cuda/cuda_ops.h"
#include "tessera/ops/cuda/moe_kernels.h"

#define TESSERA_BACKEND cuda
#define TESSERA_OWN_MOE
#include "tessera/ops/kernels/moe_host.inc"
#undef TESSERA_OWN_MOE
#undef TESSERA_BACKEND

namespace tessera::ops::cuda {
namespace {

bool same_dtype(const Tensor& a, const Tensor& b) { return a.dtype == b.dtype; }

native::MoeRows rows(DType dtype, const MoeShape& s, const Tensor& slots, const Tensor& sources) {
  return {dtype, s.N, s.M, s.C, s.k, memory<const int32_t>(slots), memory<const int32_t>(sources)};
}

}  // namespace

void moe_permute_forward(Tensor out, Tensor inp, Tensor sources, int64_t topk) {
  if (!same_dtype(out, inp)) return shared_moe_permute_forward(out, inp, sources, topk);
  const MoeShape s = checked_permute_forward(out, inp, sources, topk);
  native::moe_permute_forward(rows(out.dtype, s, Tensor(), sources), memory(out), memory<const void>(inp),
                              stream_of(out));
}

void moe_permute_backward(Tensor dinp, Tensor dout, Tensor slots, GradWrite write) {
  if (!same_dtype(dinp, dout)) return shared_moe_permute_backward(dinp, dout, slots, write);
  const MoeShape s = checked_permute_backward(dinp, dout, slots);
  native::moe_permute_backward(rows(dinp.dtype, s, slots, Tensor()), memory(dinp), memory<const void>(dout),
                               write == GradWrite::Assign, stream_of(dinp));
}

void moe_unpermute_forward(Tensor out, Tensor inp, Tensor slots, Tensor weights) {
  if (!same_dtype(out, inp)) return shared_moe_unpermute_forward(out, inp, slots, weights);
  const MoeShape s = checked_unpermute_forward(out, inp, slots, weights);
  native::moe_unpermute_forward(rows(out.dtype, s, slots, Tensor()), memory(out), memory<const void>(inp),
                                memory<const float>(weights), stream_of(out));
}

void moe_unpermute_backward(Tensor dinp, Tensor dweights, Tensor dout, Tensor inp, Tensor sources, Tensor weights) {
  if (!same_dtype(dinp, dout) || !same_dtype(dinp, inp))
    return shared_moe_unpermute_backward(dinp, dweights, dout, inp, sources, weights);
  const MoeShape s = checked_unpermute_backward(dinp, dweights, dout, inp, sources, weights);
  fill_zero(dweights);  // stream-ordered; a dropped route's gradient stays 0
  native::moe_unpermute_backward(rows(dinp.dtype, s, Tensor(), sources), memory(dinp), memory<float>(dweights),
                                 memory<const void>(dout), memory<const void>(inp), memory<const float>(weights),
                                 stream_of(dinp));
}

}  // namespace tessera::ops::cuda
