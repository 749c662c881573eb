// The OpenCL backend of the Device interface (device/device.h): `--device opencl[:N]`.
// Memory handles are cl_mem buffers (never host addresses: is_host() is false), copies
// and fills go through the device's one in-order queue, and the kernels (ops/opencl) reach
// the queue and their built programs through opencl_context() (device/opencl/cl_context.h).
// This header includes no OpenCL header, so the registry can name the backend.
#pragma once

#include <string>
#include <vector>

#include "tessera/device/device.h"

namespace tessera {
namespace opencl {
class ClContext;
}

// Every OpenCL device the ICD loader finds, in opencl:N order ("opencl:0 (name)").
std::vector<std::string> opencl_device_names();
int opencl_device_count();

// The process-wide device opencl:ordinal (created on first use; the registry checks the
// ordinal first).
Device& opencl_device(int ordinal);

// Builds the OpenCL C program `source` on the device (once per name, as the kernels'
// programs are) and throws tessera::Error carrying the compiler's build log when it fails.
void build_opencl_program(const Device& device, const std::string& name, const std::string& source,
                          const std::string& kernel);

// The OpenCL state behind a device of kind OpenCL, for ops/opencl. Aborts for any other.
opencl::ClContext& opencl_context(const Device& device);

}  // namespace tessera
