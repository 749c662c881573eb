// The host-memory backends' registration: "cpu" (the host, in every build) and "strict" (the
// test device: the CPU kernels on host memory that refuses host access, running only the ops
// a run declared). Collectives on their tensors are Gloo's, on host memory.
#include "tessera/device/backend.h"
#include "tessera/device/cpu/cpu_device.h"
#include "tessera/ops/cpu/cpu_ops.h"

namespace tessera {
namespace {

int one_device(std::string*) { return 1; }
Device& the_cpu(int) { return cpu_device(); }
Device& the_strict_device(int) { return strict_device(); }

const Backend kCpu{
    .name = "cpu",
    .host_memory = true,
    .device_count = one_device,
    .open_device = the_cpu,
    .kernels = ops::cpu::kernel_table,
};

const Backend kStrict{
    .name = "strict",
    .listed = false,
    .host_memory = true,
    .runs_declared_ops_only = true,
    .device_count = one_device,
    .open_device = the_strict_device,
    .kernels = ops::cpu::kernel_table,
};

}  // namespace

void register_cpu_backend() {
  register_backend(kCpu);
  register_backend(kStrict);
}

}  // namespace tessera
