#include "tessera/comm/backend.h"

#include "tessera/comm/gloo/gloo_communicator.h"
#ifdef TESSERA_WITH_NCCL
#include "tessera/comm/nccl/nccl_communicator.h"
#endif
#include "tessera/core/error.h"

namespace tessera {

CommBackendChoice choose_comm_backend(const std::string& requested, DeviceKind device) {
  if (requested == "gloo") return {"gloo", "distributed backend: gloo (--distributed-backend gloo)"};
  if (requested == "nccl") {
    if (device == DeviceKind::CUDA)
      return {"nccl", "distributed backend: nccl (--distributed-backend nccl on a CUDA device)"};
    if (device == DeviceKind::CPU)
      return {"gloo",
              "distributed backend: gloo (--distributed-backend nccl means the device's native collective library; "
              "for CPU tensors that is Gloo)"};
    return {"gloo", std::string("distributed backend: gloo (--distributed-backend nccl means the device's native "
                                "collective library; ") +
                        device_kind_name(device) + " has none, so collectives are staged through host memory)"};
  }
  throw usage_error("--distributed-backend must be nccl or gloo, got '" + requested + "'",
                    "nccl (Megatron's default) picks the device's native library: Gloo on the CPU, NCCL on CUDA");
}

std::unique_ptr<Communicator> create_communicator(std::shared_ptr<Store> store, int rank, int world_size,
                                                  const CommOptions& options) {
  if (options.backend == "gloo") return create_gloo_communicator(std::move(store), rank, world_size, options);
#ifdef TESSERA_WITH_NCCL
  if (options.backend == "nccl") return create_nccl_communicator(std::move(store), rank, world_size, options);
#endif
  throw runtime_error("this build has no '" + options.backend + "' communicator",
                      "pass --distributed-backend gloo: every device's tensors then go through host memory (the "
                      "host-staged path), or build tessera with the backend's library");
}

std::string native_collectives_version(DeviceKind device) {
#ifdef TESSERA_WITH_NCCL
  if (device == DeviceKind::CUDA) return "NCCL " + nccl_version();
#endif
  (void)device;
  return "";
}

NativeAllReduceRun native_all_reduce_run(DeviceKind device, size_t bytes) {
#ifdef TESSERA_WITH_NCCL
  if (device == DeviceKind::CUDA) return nccl_all_reduce_run(bytes);
#endif
  (void)bytes;
  (void)device;
  throw runtime_error("no native collective library for this device in this build",
                      "build with -DTESSERA_CUDA=ON where the CUDA toolkit and NCCL are installed");
}

}  // namespace tessera
