#include <string>
#include <string_view>

#include <oneapi/dnnl/dnnl.h>

#include "tessera/ops/cpu/cpu_ops.h"

namespace tessera::ops::cpu {
namespace {

std::string libraries() {
  const dnnl_version_t* v = dnnl_version();
  return "oneDNN " + std::to_string(v->major) + "." + std::to_string(v->minor) + "." + std::to_string(v->patch) +
         " (" + v->hash + ")";
}

// Every op has a kernel here.
constexpr bool has_kernel(std::string_view) { return true; }

}  // namespace

const KernelTable& kernel_table() {
  static const KernelTable table = [] {
    KernelTable table("cpu", libraries);
#define TESSERA_OP TESSERA_SET_KERNEL
#include "tessera/ops/ops.inc"
    return table;
  }();
  return table;
}

}  // namespace tessera::ops::cpu
