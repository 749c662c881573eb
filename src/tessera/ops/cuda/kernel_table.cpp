#include <string>
#include <string_view>

#include <cublasLt.h>
#ifdef TESSERA_WITH_CUDNN
#include <cudnn.h>
#endif

#include "tessera/ops/cuda/cuda_ops.h"

namespace tessera::ops::cuda {
namespace {

// Who runs the fused attention: cuDNN (the version loaded) where it serves the call
// (flash_route.h), else tessera's flash kernel.
std::string attention() {
#ifdef TESSERA_WITH_CUDNN
  const size_t v = cudnnGetVersion();
  return ", cuDNN " + std::to_string(v / 10000) + "." + std::to_string(v / 100 % 100) + "." + std::to_string(v % 100) +
         " attention";
#else
  return ", no cuDNN (tessera's flash kernel)";
#endif
}

// The GPU, driver and runtime versions are in the device's description (doctor's device row).
std::string libraries() {
  const size_t v = cublasLtGetVersion();
  return "tessera's kernels (ops/kernels, built with CUDA " + std::to_string(CUDART_VERSION / 1000) + "." +
         std::to_string(CUDART_VERSION % 1000 / 10) + "), cuBLASLt " + std::to_string(v / 10000) + "." + std::to_string(v / 100 % 100) + "." +
         std::to_string(v % 100) + " GEMMs" + attention();
}

// Every op but the grouped GEMM (the model runs one cuBLASLt linear per expert instead:
// MoELayer::grouped_forward) and the unsharded cross-entropy statistics (the model runs
// cross_entropy_max and _sums). The fused attention is cuDNN's SDPA or the shared flash kernel
// (flash_attention.cpp).
constexpr bool has_kernel(std::string_view op) {
  return !op.starts_with("grouped_linear_") && op != "cross_entropy_stats";
}

}  // namespace

const KernelTable& kernel_table() {
  static const KernelTable table = [] {
    KernelTable table("cuda", libraries);
#define TESSERA_OP TESSERA_SET_KERNEL
#include "tessera/ops/ops.inc"
    return table;
  }();
  return table;
}

}  // namespace tessera::ops::cuda
