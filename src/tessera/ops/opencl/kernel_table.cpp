#include <string>

#include "tessera/ops/opencl/opencl_ops.h"

namespace tessera::ops::opencl {
namespace {

// CLBlast has no version call; the device's own driver and OpenCL C version are in the
// device's description (doctor's device row).
std::string libraries() { return "OpenCL C kernels of tessera, CLBlast GEMMs"; }

}  // namespace

const KernelTable& kernel_table() {
  static const KernelTable table = TESSERA_COMPLETE_KERNEL_TABLE("opencl", libraries);
  return table;
}

}  // namespace tessera::ops::opencl
