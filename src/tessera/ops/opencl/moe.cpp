// OpenCL's mixture-of-experts ops (ops/kernels/moe.cl); shapes checked as ops/cpu/moe.cpp's.
// The grouped GEMM is not here: the model runs one linear per expert on this backend.
#include <string>

#include "tessera/device/device.h"
#include "tessera/ops/cpu/shape_checks.h"
#include "tessera/ops/kernels/float_args.h"
#include "tessera/ops/opencl/cl_launch.h"
#include "tessera/ops/opencl/opencl_ops.h"

namespace tessera::ops::opencl {

using cpu::check_map;
using cpu::check_rows;

void moe_permute_forward(Tensor out, Tensor inp, Tensor sources, int64_t topk) {
  const int64_t M = out.dim(0), C = out.dim(-1), N = inp.dim(0);
  check_rows(out, M, C, "moe_permute_forward", "out");
  check_rows(inp, N, C, "moe_permute_forward", "inp");
  check_map(sources, M, "moe_permute_forward", "sources");
  check_floating("moe_permute_forward", {{"out", out}, {"inp", inp}});
  Launch(out, "moe_permute_forward").floats(out).floats(inp).tensor(sources).scalar<int64_t>(C).scalar<int64_t>(topk).run(
      static_cast<size_t>(C), static_cast<size_t>(M));
}

void moe_permute_backward(Tensor dinp, Tensor dout, Tensor slots, GradWrite write) {
  const int64_t N = dinp.dim(0), C = dinp.dim(-1), M = dout.dim(0);
  check_rows(dinp, N, C, "moe_permute_backward", "dinp");
  check_rows(dout, M, C, "moe_permute_backward", "dout");
  TESSERA_CHECK(N > 0 && slots.numel() % N == 0, "moe_permute_backward: slots " + shape_str(slots.shape));
  check_map(slots, slots.numel(), "moe_permute_backward", "slots");
  check_floating("moe_permute_backward", {{"dinp", dinp}, {"dout", dout}});
  Launch(dinp, "moe_permute_backward")
      .floats(dinp)
      .floats(dout)
      .tensor(slots)
      .scalar<int64_t>(C)
      .scalar<int64_t>(slots.numel() / N)
      .scalar<int32_t>(write == GradWrite::Assign)
      .run(static_cast<size_t>(C), static_cast<size_t>(N));
}

void moe_unpermute_forward(Tensor out, Tensor inp, Tensor slots, Tensor weights) {
  const int64_t N = out.dim(0), C = out.dim(-1), M = inp.dim(0);
  check_rows(out, N, C, "moe_unpermute_forward", "out");
  check_rows(inp, M, C, "moe_unpermute_forward", "inp");
  const int64_t k = N > 0 ? weights.numel() / N : 0;
  check_map(slots, N * k, "moe_unpermute_forward", "slots");
  weights.check_dtype(DType::F32);
  check_floating("moe_unpermute_forward", {{"out", out}, {"inp", inp}});
  Launch(out, "moe_unpermute_forward").floats(out).floats(inp).tensor(slots).tensor(weights).scalar<int64_t>(C)
      .scalar<int64_t>(k).run(static_cast<size_t>(C), static_cast<size_t>(N));
}

void moe_unpermute_backward(Tensor dinp, Tensor dweights, Tensor dout, Tensor inp, Tensor sources, Tensor weights) {
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
  fill_zero(dweights);
  Launch(dinp, "moe_unpermute_backward")
      .floats(dinp)
      .tensor(dweights)
      .floats(dout)
      .floats(inp)
      .tensor(sources)
      .tensor(weights)
      .scalar<int64_t>(C)
      .scalar<int64_t>(k)
      .run(static_cast<size_t>(M));
}

}  // namespace tessera::ops::opencl
