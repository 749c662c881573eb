// The CPU backend of ops.h: same names, argument order and conventions (see ops.h).
// Its kernel table (cpu/kernel_table.cpp) serves the CPU and strict devices; tests may
// call these directly.
#pragma once

#include "tessera/ops/cpu/cpu_tensor.h"
#include "tessera/ops/kernel_table.h"
#include "tessera/ops/ops.h"

namespace tessera::ops::cpu {

const KernelTable& kernel_table();

// Every op of ops.inc, with its exact signature (kernel_table.h).
#define TESSERA_OP TESSERA_DECLARE_KERNEL
#include "tessera/ops/ops.inc"

}  // namespace tessera::ops::cpu
