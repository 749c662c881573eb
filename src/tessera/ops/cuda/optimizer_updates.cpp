// CUDA's optimizer updates: ops/kernels/optimizer_updates_host.inc's shared kernels, and the
// multi-tensor AdamW as a native typed kernel (multi_tensor_kernels.h, the same bits).
#include "tessera/device/cuda/cuda_stream.h"
#include "tessera/ops/cuda/cuda_launch.h"
#include "tessera/ops/cuda/cuda_ops.h"
#include "tessera/ops/cuda/multi_tensor_kernels.h"

#define TESSERA_BACKEND cuda
#define TESSERA_OWN_MULTI_TENSOR_ADAMW
#include "tessera/ops/kernels/optimizer_updates_host.inc"
#undef TESSERA_OWN_MULTI_TENSOR_ADAMW
#undef TESSERA_BACKEND

namespace tessera::ops::cuda {
namespace {

template <typename T>
T* at(const Tensor& t) {
  return t.empty() ? nullptr : reinterpret_cast<T*>(static_cast<char*>(t.handle) + t.offset);
}

bool aligned16(std::initializer_list<const Tensor*> tensors) {
  for (const Tensor* t : tensors)
    if (!t->empty() && reinterpret_cast<uintptr_t>(at<char>(*t)) % 16 != 0) return false;
  return true;
}

}  // namespace

void multi_tensor_adamw(Tensor main, Tensor param, Tensor grad, Tensor m, Tensor v, Tensor chunks, Tensor scalars,
                        float beta1, float beta2, float eps) {
  const int64_t rows = check_slab_update("multi_tensor_adamw", main, param, grad, chunks, scalars);
  check_f32("multi_tensor_adamw", {{"m", m}, {"v", v}});
  // The host's constants, as the shared kernel's arguments (optimizer_updates_host.inc).
  const float w1 = static_cast<float>(1.0 - static_cast<double>(beta1));
  native::AdamwArgs a{};
  a.mains = at<float>(main);
  a.params = at<void>(param);
  a.param_type = param.empty()                ? native::ParamType::None
                 : param.dtype == DType::BF16 ? native::ParamType::BF16
                                              : native::ParamType::F16;
  a.grad = at<float>(grad);
  a.m = at<float>(m);
  a.v = at<float>(v);
  a.chunks = at<int64_t>(chunks);
  a.rows = rows;
  a.scalars = at<float>(scalars);
  a.w1 = w1;
  a.w1c = 1.0f - w1;
  a.beta2 = beta2;
  a.w2 = static_cast<float>(1.0 - static_cast<double>(beta2));
  a.eps = eps;
  a.lerp_low = w1 < 0.5f;
  a.aligned = aligned16({&main, &grad, &m, &v});
  tessera::cuda::activate(*main.device);
  native::multi_tensor_adamw(a, tessera::cuda::stream_of(*main.device));
}

}  // namespace tessera::ops::cuda
