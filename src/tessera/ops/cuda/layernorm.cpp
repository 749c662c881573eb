// LayerNorm on CUDA (ops/kernels/layernorm.cl); checks as ops/cpu/layernorm.cpp.
#include "tessera/ops/cuda/cuda_launch.h"
#include "tessera/ops/cuda/cuda_ops.h"

namespace tessera::ops::cuda {

void layernorm_forward(Tensor out, Tensor mean, Tensor rstd, Tensor inp, Tensor weight, Tensor bias, float eps) {
  const int64_t C = inp.dim(-1), N = inp.numel() / C;
  TESSERA_CHECK(out.numel() == N * C && weight.numel() == C && (bias.empty() || bias.numel() == C),
                "layernorm: inp " + shape_str(inp.shape) + ", out " + shape_str(out.shape) + ", weight " +
                    shape_str(weight.shape));
  TESSERA_CHECK((mean.empty() || mean.numel() == N) && (rstd.empty() || rstd.numel() == N),
                "layernorm: mean/rstd must have one entry per row (" + std::to_string(N) + ")");
  CudaLaunch(out, "layernorm_forward")
      .tensor(out)
      .tensor(mean)
      .tensor(rstd)
      .tensor(inp)
      .tensor(weight)
      .tensor(bias)
      .scalar<int64_t>(C)
      .scalar<float>(eps)
      .run(N);
}

void layernorm_backward(Tensor dinp, Tensor dweight, Tensor dbias, Tensor dout, Tensor inp, Tensor weight,
                        Tensor mean, Tensor rstd) {
  const int64_t C = inp.dim(-1), N = inp.numel() / C;
  TESSERA_CHECK(dout.numel() == N * C && weight.numel() == C && mean.numel() == N && rstd.numel() == N,
                "layernorm backward: dout " + shape_str(dout.shape) + ", inp " + shape_str(inp.shape));
  TESSERA_CHECK((dinp.empty() || dinp.numel() == N * C) && (dweight.empty() || dweight.numel() == C) &&
                    (dbias.empty() || dbias.numel() == C),
                "layernorm backward: gradient shapes");
  if (!dinp.empty())
    CudaLaunch(dout, "layernorm_backward_input")
        .tensor(dinp)
        .tensor(dout)
        .tensor(inp)
        .tensor(weight)
        .tensor(mean)
        .tensor(rstd)
        .scalar<int64_t>(C)
        .run(N);
  if (!dweight.empty() || !dbias.empty())
    CudaLaunch(dout, "layernorm_backward_params")
        .tensor(dweight)
        .tensor(dbias)
        .tensor(dout)
        .tensor(inp)
        .tensor(mean)
        .tensor(rstd)
        .scalar<int64_t>(C)
        .scalar<int64_t>(N)
        .run(C);
}

}  // namespace tessera::ops::cuda
