// Optimizer updates on CUDA (ops/kernels/optimizer.cl). The step's scalars are computed on
// the host exactly as ops/cpu/optimizer_updates.cpp does (in double, rounded once), so the
// kernels do the same float operations as the CPU.
#include <cmath>

#include "tessera/ops/cuda/cuda_launch.h"
#include "tessera/ops/cuda/cuda_ops.h"

namespace tessera::ops::cuda {

void adamw_update(Tensor param, Tensor grad, Tensor m, Tensor v, float lr, float beta1, float beta2, float eps,
                  float weight_decay, int64_t step, float grad_scale) {
  const int64_t n = param.numel();
  TESSERA_CHECK(grad.numel() == n && m.numel() == n && v.numel() == n,
                "adamw: param " + shape_str(param.shape) + ", grad " + shape_str(grad.shape) + ", m " +
                    shape_str(m.shape) + ", v " + shape_str(v.shape));
  TESSERA_CHECK(step >= 1, "adamw: step is 1-based");
  const float decay = static_cast<float>(1.0 - static_cast<double>(lr) * weight_decay);
  const float w1 = static_cast<float>(1.0 - static_cast<double>(beta1));
  const float w2 = static_cast<float>(1.0 - static_cast<double>(beta2));
  const double bc1 = 1.0 - std::pow(static_cast<double>(beta1), static_cast<double>(step));
  const double bc2 = 1.0 - std::pow(static_cast<double>(beta2), static_cast<double>(step));
  CudaLaunch(param, "adamw_update")
      .tensor(param)
      .tensor(grad)
      .tensor(m)
      .tensor(v)
      .scalar<float>(decay)
      .scalar<float>(w1)
      .scalar<int32_t>(w1 < 0.5f)  // ATen's lerp: a + w (b - a) for w < 0.5, else b - (b - a)(1 - w)
      .scalar<float>(1.0f - w1)
      .scalar<float>(beta2)
      .scalar<float>(w2)
      .scalar<float>(static_cast<float>(lr / bc1))
      .scalar<float>(static_cast<float>(std::sqrt(bc2)))
      .scalar<float>(eps)
      .scalar<float>(grad_scale)
      .run(n);
}

void sgd_update(Tensor param, Tensor grad, Tensor momentum_buf, float lr, float momentum, float weight_decay,
                int64_t step, float grad_scale) {
  const int64_t n = param.numel();
  TESSERA_CHECK(grad.numel() == n, "sgd: param " + shape_str(param.shape) + ", grad " + shape_str(grad.shape));
  TESSERA_CHECK(step >= 1, "sgd: step is 1-based");
  // momentum == 0: torch keeps no buffer (the kernel sees a null one).
  const Tensor buf = momentum == 0.0f ? Tensor() : momentum_buf;
  if (!buf.empty()) TESSERA_CHECK(buf.numel() == n, "sgd: momentum buffer " + shape_str(buf.shape));
  CudaLaunch(param, "sgd_update")
      .tensor(param)
      .tensor(grad)
      .tensor(buf)
      .scalar<float>(lr)
      .scalar<float>(momentum)
      .scalar<float>(weight_decay)
      .scalar<int32_t>(step == 1)
      .scalar<float>(grad_scale)
      .run(n);
}

}  // namespace tessera::ops::cuda
