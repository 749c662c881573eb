// CUDA's host side of ops/kernels/sequence_regroup_host.inc.
#include "tessera/ops/cuda/cuda_ops.h"

#define TESSERA_BACKEND cuda
#include "tessera/ops/kernels/sequence_regroup_host.inc"
#undef TESSERA_BACKEND
