// CUDA's host side of ops/kernels/optimizer_updates_host.inc.
#include "tessera/ops/cuda/cuda_launch.h"
#include "tessera/ops/cuda/cuda_ops.h"

#define TESSERA_BACKEND cuda
#include "tessera/ops/kernels/optimizer_updates_host.inc"
#undef TESSERA_BACKEND
