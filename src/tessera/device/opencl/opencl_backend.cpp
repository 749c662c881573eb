// The OpenCL backend's registration (`--device opencl[:N]`): its devices, the kernels of
// ops/opencl; no native collective library, so collectives are staged through host memory.
#include <string>

#include "tessera/device/backend.h"
#include "tessera/device/opencl/opencl_device.h"
#include "tessera/ops/opencl/opencl_ops.h"

namespace tessera {
namespace {

int count(std::string* why) {
  const int n = opencl_device_count();
  if (n == 0 && why) *why = "the OpenCL ICD loader lists no platform with a device";
  return n;
}

const Backend kOpenCl{
    .name = "opencl",
    .device_count = count,
    .open_device = opencl_device,
    .no_device_hint = "install a driver (Debian: pocl-opencl-icd runs OpenCL on the CPU); clinfo lists what the "
                      "loader finds in /etc/OpenCL/vendors or OCL_ICD_VENDORS; or run on --device cpu",
    .kernels = ops::opencl::kernel_table,
};

}  // namespace

void register_opencl_backend() { register_backend(kOpenCl); }

}  // namespace tessera
