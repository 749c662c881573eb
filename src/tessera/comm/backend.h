// --distributed-backend, as the two-server guide's adaptor reads it: "nccl" means "the
// device's native collective library" (Gloo for CPU tensors, NCCL on CUDA, HCCL on an Ascend
// backend), so Megatron scripts run unchanged; "gloo" forces Gloo. The log says which was used.
#pragma once

#include <string>

#include "tessera/device/device.h"

namespace tessera {

struct CommBackendChoice {
  std::string backend;   // "gloo" or "nccl"
  std::string log_line;  // "distributed backend: gloo (--distributed-backend nccl: ...)"
};

// Throws tessera::Error (usage) for a name other than nccl or gloo (Megatron's choices).
CommBackendChoice choose_comm_backend(const std::string& requested, DeviceKind device);

}  // namespace tessera
