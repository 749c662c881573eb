// CUDA's host side of ops/kernels/cross_entropy_host.inc, with its own row-statistics
// kernels (row_kernels.cuh): cross_entropy_max and cross_entropy_sums a row per warp of
// 32 threads (launched over 32 * N work-items), each lane one of the CPU's 32 partial sums.
#include "tessera/ops/cuda/cuda_launch.h"
#include "tessera/ops/cuda/cuda_ops.h"

#define TESSERA_BACKEND cuda
#define TESSERA_CROSS_ENTROPY_ROW_KERNEL(name) name "_rows"
#define TESSERA_CROSS_ENTROPY_ROW_ITEMS(N) (32 * (N))  // row_kernels.cuh's ROW_LANES
#include "tessera/ops/kernels/cross_entropy_host.inc"
#undef TESSERA_CROSS_ENTROPY_ROW_ITEMS
#undef TESSERA_CROSS_ENTROPY_ROW_KERNEL
#undef TESSERA_BACKEND
