#include <string>

#include <cublasLt.h>

#include "tessera/ops/cuda/cuda_ops.h"

namespace tessera::ops::cuda {
namespace {

// The GPU, driver and runtime versions are in the device's description (doctor's device row).
std::string libraries() {
  const size_t v = cublasLtGetVersion();
  return "tessera's kernels (ops/kernels, built with CUDA " + std::to_string(CUDART_VERSION / 1000) + "." +
         std::to_string(CUDART_VERSION % 1000 / 10) + "), cuBLASLt " + std::to_string(v / 10000) + "." + std::to_string(v / 100 % 100) + "." +
         std::to_string(v % 100) + " GEMMs";
}

}  // namespace

const KernelTable& kernel_table() {
  // No fused attention yet (cuDNN's SDPA, issue 29): the model runs the unfused ops here.
  static const KernelTable table = TESSERA_KERNEL_TABLE_OF("cuda", libraries, TESSERA_UNFUSED_OPS);
  return table;
}

}  // namespace tessera::ops::cuda
