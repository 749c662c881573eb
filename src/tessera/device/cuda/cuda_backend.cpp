// The CUDA backend's registration (`--device cuda[:N]`): its GPUs, the kernels of ops/cuda,
// NCCL (comm/nccl) as its native collective library when the build has it, its doctor rows
// (cuda_doctor.h).
#include <cstdlib>
#include <string>

#include "tessera/device/backend.h"
#include "tessera/device/cuda/cuda_device.h"
#include "tessera/device/cuda/cuda_doctor.h"
#include "tessera/ops/cuda/cuda_ops.h"
#ifdef TESSERA_WITH_NCCL
#include "tessera/comm/nccl/nccl_communicator.h"
#endif

namespace tessera {
namespace {

int count(std::string* why) { return cuda_device_count(why); }

// Plain `cuda` under a launcher is this node's LOCAL_RANK-th GPU, as Megatron's
// torch.cuda.set_device(local_rank): one GPU per rank.
int local_rank_gpu(int count) {
  const char* local_rank = std::getenv("LOCAL_RANK");
  return local_rank ? std::atoi(local_rank) % count : 0;
}

const NativeCollectives* collectives() {
#ifdef TESSERA_WITH_NCCL
  return &nccl_collectives();
#else
  return nullptr;
#endif
}

const Backend kCuda{
    .name = "cuda",
    .display_name = "CUDA",
    .device_count = count,
    .open_device = cuda_device,
    .default_ordinal = local_rank_gpu,
    .no_device_hint = "nvidia-smi shows the GPUs and driver; check CUDA_VISIBLE_DEVICES, or run on --device cpu",
    .doctor_rows = cuda_doctor_rows,
    .kernels = ops::cuda::kernel_table,
    .fused_attention_dropout = false,  // cuDNN's attention serves undropped calls only (ops/cuda/flash_route.h)
    .collectives = collectives(),
};

}  // namespace

void register_cuda_backend() { register_backend(kCuda); }

}  // namespace tessera
