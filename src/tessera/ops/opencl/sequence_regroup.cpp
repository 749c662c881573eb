// OpenCL's host side of ops/kernels/sequence_regroup_host.inc.
#include "tessera/ops/opencl/opencl_ops.h"

#define TESSERA_BACKEND opencl
#include "tessera/ops/kernels/sequence_regroup_host.inc"
#undef TESSERA_BACKEND
