#include <string>
#include <string_view>

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

// Every op but the fused attention (cuDNN's SDPA comes with issue 29: the model runs the
// unfused attention here) and the mixture of experts' (MoE training refuses this device; the
// grouped GEMM falls back to one linear per expert until cuBLASLt's grouped GEMM backs it).
constexpr bool has_kernel(std::string_view op) {
  return !op.starts_with("flash_attention_") && !op.starts_with("moe_") && !op.starts_with("grouped_linear_");
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
