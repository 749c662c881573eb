#include "tessera/comm/backend.h"

#include "tessera/comm/gloo/gloo_communicator.h"
#include "tessera/core/error.h"
#include "tessera/device/registry.h"

namespace tessera {
namespace {

// The native library registered under `name` ("nccl") by any backend, or nullptr.
const NativeCollectives* collectives_named(const std::string& name) {
  for (const Backend* b : registered_backends())
    if (b->collectives != nullptr && name == b->collectives->name) return b->collectives;
  return nullptr;
}

}  // namespace

CommBackendChoice choose_comm_backend(const std::string& requested, const Backend& device) {
  if (requested == "gloo") return {"gloo", "distributed backend: gloo (--distributed-backend gloo)"};
  if (requested == "nccl") {
    if (device.collectives != nullptr)
      return {device.collectives->name, std::string("distributed backend: ") + device.collectives->name +
                                            " (--distributed-backend nccl on a " + device.name + " device)"};
    if (device.host_memory)
      return {"gloo",
              "distributed backend: gloo (--distributed-backend nccl means the device's native collective library; "
              "for CPU tensors that is Gloo)"};
    return {"gloo", std::string("distributed backend: gloo (--distributed-backend nccl means the device's native "
                                "collective library; ") +
                        device.name + " has none, so collectives are staged through host memory)"};
  }
  throw usage_error("--distributed-backend must be nccl or gloo, got '" + requested + "'",
                    "nccl (Megatron's default) picks the device's native library: Gloo on the CPU, NCCL on CUDA");
}

std::unique_ptr<Communicator> create_communicator(std::shared_ptr<Store> store, int rank, int world_size,
                                                  const CommOptions& options) {
  if (options.backend == "gloo") return create_gloo_communicator(std::move(store), rank, world_size, options);
  if (const NativeCollectives* native = collectives_named(options.backend))
    return native->create(std::move(store), rank, world_size, options);
  throw runtime_error("this build has no '" + options.backend + "' communicator",
                      "pass --distributed-backend gloo: every device's tensors then go through host memory (the "
                      "host-staged path), or build tessera with the backend's library");
}


}  // namespace tessera
