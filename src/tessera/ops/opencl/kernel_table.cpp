#include <string>
#include <string_view>

#include "tessera/ops/opencl/opencl_ops.h"

namespace tessera::ops::opencl {
namespace {

// CLBlast has no version call; the device's own driver and OpenCL C version are in the
// device's description (doctor's device row).
std::string libraries() { return "OpenCL C kernels of tessera, CLBlast GEMMs"; }

// Every op but the experts' grouped GEMM (the model runs one linear per expert here) and the
// unsharded cross-entropy statistics (the model runs cross_entropy_max and _sums).
constexpr bool has_kernel(std::string_view op) {
  return !op.starts_with("grouped_linear_") && op != "cross_entropy_stats";
}

}  // namespace

const KernelTable& kernel_table() {
  static const KernelTable table = [] {
    KernelTable table("opencl", libraries);
#define TESSERA_OP TESSERA_SET_KERNEL
#include "tessera/ops/ops.inc"
    return table;
  }();
  return table;
}

}  // namespace tessera::ops::opencl
