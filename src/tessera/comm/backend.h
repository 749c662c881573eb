// Choosing and creating the job's communicator: the one door through which code outside
// comm/ (train, doctor) gets one, so it never names a backend's header.
//
// --distributed-backend: "nccl" means "the device's native collective library" (Gloo for
// host tensors and for devices without one, through the host-staged path; NCCL on CUDA,
// HCCL on an Ascend backend), so Megatron scripts run unchanged; "gloo" forces Gloo. The log
// says which was used.
#pragma once

#include <chrono>
#include <memory>
#include <optional>
#include <string>

#include "tessera/comm/communicator.h"
#include "tessera/comm/store.h"
#include "tessera/device/backend.h"
#include "tessera/device/device.h"

namespace tessera {

struct CommBackendChoice {
  std::string backend;   // "gloo" or "nccl"
  std::string log_line;  // "distributed backend: gloo (--distributed-backend nccl: ...)"
};

// Throws tessera::Error (usage) for a name other than nccl or gloo (Megatron's choices).
// `device`: the backend of the run's device (device/backend.h).
CommBackendChoice choose_comm_backend(const std::string& requested, const Backend& device);

struct CommOptions {
  std::string backend = "gloo";  // CommBackendChoice::backend
  // Bounds connecting and every call (--distributed-timeout-minutes; Megatron's default is
  // 10 minutes). A native library maps it onto its own timeouts.
  std::chrono::milliseconds timeout = std::chrono::minutes(10);
  // For choosing the network interface by the route to MASTER_ADDR; empty for one process.
  std::string master_addr;
  int master_port = 0;
  // GLOO_SOCKET_IFNAME; unset reads the environment variable.
  std::optional<std::string> socket_ifname;
  // Prefix of every store key (e.g. launch::WorkerIdentity::key_prefix).
  std::string key_prefix;
};

// A device backend's native collective library (NCCL for cuda, HCCL for an Ascend backend),
// registered with its backend (Backend::collectives, in the backend's folder).
struct NativeCollectives {
  const char* name = "";  // --distributed-backend's spelling: "nccl"
  std::unique_ptr<Communicator> (*create)(std::shared_ptr<Store> store, int rank, int world_size,
                                          const CommOptions& options) = nullptr;
};

// The world communicator of rank `rank` of `world_size`, bootstrapped through `store`.
// Throws tessera::Error naming the backend when this build lacks it.
std::unique_ptr<Communicator> create_communicator(std::shared_ptr<Store> store, int rank, int world_size,
                                                  const CommOptions& options);

}  // namespace tessera
