#include <oneapi/dnnl/dnnl.h>

#include "tessera/ops/cpu/cpu_ops.h"

namespace tessera::ops::cpu {
namespace {

std::string libraries() {
  const dnnl_version_t* v = dnnl_version();
  return "oneDNN " + std::to_string(v->major) + "." + std::to_string(v->minor) + "." + std::to_string(v->patch) +
         " (" + v->hash + ")";
}

}  // namespace

const KernelTable& kernel_table() {
  static const KernelTable table = TESSERA_COMPLETE_KERNEL_TABLE("cpu", libraries);
  return table;
}

}  // namespace tessera::ops::cpu
