// The host-memory backends: the CPU device, and the strict test device (the same host
// memory, but is_host() is false, so any host access outside a backend aborts and names
// its place). Both run the CPU kernels (ops/cpu), which reach memory through
// cpu_memory() below, the one accessor of this backend; cpu_backend.cpp registers both.
#pragma once

#include "tessera/device/backend.h"
#include "tessera/device/device.h"

namespace tessera {

Device& strict_device();

// True for the devices whose handles are host addresses (Backend::host_memory: cpu, strict).
inline bool holds_host_memory(const Device& d) { return d.backend().host_memory; }

// The address of a tensor in host memory (of a host-memory device, or of no device), for
// backend code: CPU kernels, the host-memory paths of comm/. Aborts for any other device.
inline char* cpu_memory(const Tensor& t) {
  if (t.handle == nullptr) return nullptr;
  TESSERA_CHECK(t.device == nullptr || holds_host_memory(*t.device), "CPU backend given a tensor on " + t.device->name());
  return static_cast<char*>(t.handle) + t.offset;
}

}  // namespace tessera
