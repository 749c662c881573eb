// TESSERA_HD: a function that nvcc compiles for both the GPU and the host, and the host
// compiler as a plain inline function, so the native kernels' arithmetic and indexing
// (element_math.h, rope_math.h, embedding_math.h) run in the CPU tests.
#pragma once

#if defined(__CUDACC__)
#define TESSERA_HD __host__ __device__ inline
#else
#define TESSERA_HD inline
#endif
