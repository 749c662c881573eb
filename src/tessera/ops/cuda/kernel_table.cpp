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
  static const KernelTable table = TESSERA_COMPLETE_KERNEL_TABLE("cuda", libraries);
  return table;
}

}  // namespace tessera::ops::cuda
