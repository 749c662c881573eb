// CUDA's side of ops/kernels/fp64_host.inc: the shared fp64 kernels from the fatbin (every
// GPU has doubles), and in the default mode the native multi-tensor sum of squares
// (multi_tensor_kernels.h); --deterministic-mode keeps sum_squares.cl's lanes and bits.
#include "tessera/device/cuda/cuda_stream.h"
#include "tessera/ops/cuda/cuda_launch.h"
#include "tessera/ops/cuda/cuda_ops.h"
#include "tessera/ops/cuda/multi_tensor_kernels.h"

namespace tessera::ops::cuda {
namespace {

CudaLaunch fp64_launch(const Tensor& on, const char* kernel) { return CudaLaunch(on, kernel); }

class Partials {
 public:
  Partials(const Tensor& on, size_t bytes) : lease_(*on.device, bytes) {}
  CudaLaunch& pass(CudaLaunch& launch) const { return launch.pointer(lease_.data()); }

 private:
  ScratchLease lease_;
};

template <typename Op>
bool ran_on_host(std::initializer_list<Tensor>, std::initializer_list<Tensor>, Op) {
  return false;
}

template <typename T>
T* at(const Tensor& t) {
  return reinterpret_cast<T*>(static_cast<char*>(t.handle) + t.offset);
}

bool native_multi_tensor_sum_squares(const Tensor& sums, const Tensor& workspace, const Tensor& grad,
                                     const Tensor& chunks, int64_t rows) {
  if (grad.device->deterministic_mode()) return false;
  tessera::cuda::activate(*grad.device);
  native::multi_tensor_sum_squares(at<double>(sums), at<double>(workspace), at<const float>(grad),
                                   at<const int64_t>(chunks), rows, tessera::cuda::stream_of(*grad.device));
  return true;
}

}  // namespace
}  // namespace tessera::ops::cuda

#define TESSERA_BACKEND cuda
#include "tessera/ops/kernels/fp64_host.inc"
#undef TESSERA_BACKEND
