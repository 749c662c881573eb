// The OpenCL C side of the shared kernel sources (ops/kernels/*.cl), placed first in every
// OpenCL program: the spellings the sources use that OpenCL C lacks. prelude_cuda.cuh
// gives CUDA the same spellings, so one kernel body compiles as both.

// Functions called from kernels (CUDA needs __device__ on them).
#define DEVICE_FN
// A uint4 from its lanes (OpenCL C's vector literal; CUDA has make_uint4).
#define make_uint4(x, y, z, w) ((uint4)((x), (y), (z), (w)))
