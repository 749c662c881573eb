// The CUDA backend of ops.h: host functions with exactly the signatures and contracts of
// ops.h (outputs first, every backward accumulates, empty tensor = absent), each launching
// kernels of kernels.cu (mostly the shared sources of ops/kernels) or cuBLASLt GEMMs on
// the device's default stream. Calls return once the work is enqueued; copies to the host
// wait for it. Its kernel table (kernel_table.cpp) serves devices of kind CUDA.
#pragma once

#include "tessera/ops/kernel_table.h"
#include "tessera/ops/ops.h"

namespace tessera::ops::cuda {

const KernelTable& kernel_table();

// Every op of ops.inc, with its exact signature (kernel_table.h).
#define TESSERA_OP TESSERA_DECLARE_KERNEL
#include "tessera/ops/ops.inc"

}  // namespace tessera::ops::cuda
