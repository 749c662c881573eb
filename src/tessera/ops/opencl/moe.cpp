// OpenCL's host side of ops/kernels/moe_host.inc.
#include "tessera/ops/opencl/cl_launch.h"
#include "tessera/ops/opencl/opencl_ops.h"

#define TESSERA_BACKEND opencl
#include "tessera/ops/kernels/moe_host.inc"
#undef TESSERA_BACKEND
