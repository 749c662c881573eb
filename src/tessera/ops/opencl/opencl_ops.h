// The OpenCL backend of ops.h: host functions with exactly the signatures and contracts
// of ops.h (outputs first, every backward accumulates, empty tensor = absent), each
// enqueuing OpenCL C kernels (kernels/*.cl) or CLBlast GEMMs on the tensors' device.
// Calls return once the work is enqueued; the device's in-order queue orders them, and
// copies to the host wait for them. Its kernel table (kernel_table.cpp) serves devices of
// kind OpenCL.
#pragma once

#include "tessera/ops/kernel_table.h"
#include "tessera/ops/ops.h"

namespace tessera::ops::opencl {

const KernelTable& kernel_table();

// Every op of ops.inc, with its exact signature (kernel_table.h).
#define TESSERA_OP TESSERA_DECLARE_KERNEL
#include "tessera/ops/ops.inc"

}  // namespace tessera::ops::opencl
