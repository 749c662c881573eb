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

// The rows of a call: N tokens of k routes, M permuted rows of C channels.
native::MoeRows rows(DType dtype, int64_t N, int64_t M, int64_t C, int64_t k, const Tensor& slots,
                     const Tensor& sources) {
  return {dtype,
          N,
          M,
          C,
          k,
          slots.empty() ? nullptr : memory<const int32_t>(slots),
          sources.empty() ? nullptr : memory<const int32_t>(sources)};
}

}  // namespace

void moe_permute_forward(Tensor out, Tensor inp, Tensor sources, int64_t topk) {
  if (!same_dtype(out, inp)) return shared_moe_permute_forward(out, inp, sources, topk);
  const int64_t M = out.dim(0), C = out.dim(-1), N = inp.dim(0);
  check_rows(out, M, C, "moe_permute_forward", "out");
  check_rows(inp, N, C, "moe_permute_forward", "inp");
  check_map(sources, M, "moe_permute_forward", "sources");
  check_floating("moe_permute_forward", {{"out", out}, {"inp", inp}});
  native::moe_permute_forward(rows(out.dtype, N, M, C, topk, Tensor(), sources), memory<void>(out),
                              memory<const void>(inp), stream_of(out));
}

void moe_permute_backward(Tensor dinp, Tensor dout, Tensor slots, GradWrite write) {
  if (!same_dtype(dinp, dout)) return shared_moe_permute_backward(dinp, dout, slots, write);
  const int64_t N = dinp.dim(0), C = dinp.dim(-1), M = dout.dim(0);
  check_rows(dinp, N, C, "moe_permute_backward", "dinp");
  check_rows(dout, M, C, "moe_permute_backward", "dout");
  TESSERA_CHECK(N > 0 && slots.numel() % N == 0, "moe_permute_backward: slots " + shape_str(slots.shape));
  check_map(slots, slots.numel(), "moe_permute_backward", "slots");
  check_floating("moe_permute_backward", {{"dinp", dinp}, {"dout", dout}});
  native::moe_permute_backward(rows(dinp.dtype, N, M, C, slots.numel() / N, slots, Tensor()), memory<void>(dinp),
                               memory<const void>(dout), write == GradWrite::Assign, stream_of(dinp));
}

void moe_unpermute_forward(Tensor out, Tensor inp, Tensor slots, Tensor weights) {
  if (!same_dtype(out, inp)) return shared_moe_unpermute_forward(out, inp, slots, weights);
  const int64_t N = out.dim(0), C = out.dim(-1), M = inp.dim(0);
  check_rows(out, N, C, "moe_unpermute_forward", "out");
  check_rows(inp, M, C, "moe_unpermute_forward", "inp");
  const int64_t k = N > 0 ? weights.numel() / N : 0;
  check_map(slots, N * k, "moe_unpermute_forward", "slots");
  weights.check_dtype(DType::F32);
  check_floating("moe_unpermute_forward", {{"out", out}, {"inp", inp}});
  native::moe_unpermute_forward(rows(out.dtype, N, M, C, k, slots, Tensor()), memory<void>(out),
                                memory<const void>(inp), memory<const float>(weights), stream_of(out));
}

void moe_unpermute_backward(Tensor dinp, Tensor dweights, Tensor dout, Tensor inp, Tensor sources, Tensor weights) {
  if (!same_dtype(dinp, dout) || !same_dtype(dinp, inp))
    return shared_moe_unpermute_backward(dinp, dweights, dout, inp, sources, weights);
  const int64_t M = dinp.dim(0), C = dinp.dim(-1), N = dout.dim(0);
  check_rows(dinp, M, C, "moe_unpermute_backward", "dinp");
  check_rows(dout, N, C, "moe_unpermute_backward", "dout");
  check_rows(inp, M, C, "moe_unpermute_backward", "inp");
  check_map(sources, M, "moe_unpermute_backward", "sources");
  const int64_t k = N > 0 ? weights.numel() / N : 0;
  weights.check_dtype(DType::F32);
  dweights.check_dtype(DType::F32);
  TESSERA_CHECK(dweights.numel() == N * k, "moe_unpermute_backward: dweights " + shape_str(dweights.shape));
  check_floating("moe_unpermute_backward", {{"dinp", dinp}, {"dout", dout}, {"inp", inp}});
  fill_zero(dweights);  // stream-ordered; a dropped route's gradient stays 0
  native::moe_unpermute_backward(rows(dinp.dtype, N, M, C, k, Tensor(), sources), memory<void>(dinp),
                                 memory<float>(dweights), memory<const void>(dout), memory<const void>(inp),
                                 memory<const float>(weights), stream_of(dinp));
}

}  // namespace tessera::ops::cuda
