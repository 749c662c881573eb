// The CUDA backend of the Device interface (device/device.h): `--device cuda[:N]`. Memory
// handles are device pointers from cudaMalloc (never managed memory, never host-readable:
// is_host() is false); pinned buffers come from cudaMallocHost. Every device owns one
// non-blocking stream, its default stream: ops, copies and fills run on it in issue order,
// and streams made with create_stream() are ordered against it with events.
// This header includes no CUDA header, so the registry can name the backend.
#pragma once

#include <string>
#include <vector>

#include "tessera/device/device.h"

namespace tessera {

// The GPUs the CUDA runtime sees, in cuda:N order; 0 when there is none or no usable
// driver, with the runtime's reason in *why ("cudaErrorNoDevice: no CUDA-capable device
// is detected").
int cuda_device_count(std::string* why = nullptr);
// "cuda:0 (NVIDIA H200, sm_90, 139 GiB)" for each GPU.
std::vector<std::string> cuda_device_names();

// cudaDriverGetVersion (e.g. 13000; 0 when no driver is installed) and the version of the
// runtime linked in (statically: the toolkit's).
int cuda_driver_version();
int cuda_runtime_version();

// The process-wide device cuda:ordinal (created on first use; the registry checks the
// ordinal first).
Device& cuda_device(int ordinal);

}  // namespace tessera
