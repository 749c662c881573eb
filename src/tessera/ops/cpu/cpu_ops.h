// The CPU backend of ops.h: same names, argument order and conventions (see ops.h).
// Its kernel table (cpu/kernel_table.cpp) serves the CPU and strict devices; tests may
// call these directly.
#pragma once

#include "tessera/ops/cpu/cpu_tensor.h"
#include "tessera/ops/kernel_table.h"
#include "tessera/ops/ops.h"

namespace tessera::ops::cpu {

const KernelTable& kernel_table();

// Every op of ops.h, with its exact signature (kernel_table.h).
TESSERA_DECLARE_KERNELS()

}  // namespace tessera::ops::cpu
