// CUDA's host side of ops/kernels/elementwise_host.inc.
#include "tessera/ops/cuda/cuda_launch.h"
#include "tessera/ops/cuda/cuda_ops.h"

#define TESSERA_BACKEND cuda
#include "tessera/ops/kernels/elementwise_host.inc"
#undef TESSERA_BACKEND
