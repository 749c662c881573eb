// Every kernel of the CUDA backend, compiled by nvcc into one fatbin (ops/cuda/CMakeLists.txt)
// that cuda_launch.cpp loads and looks kernels up in by name, as the OpenCL backend does
// with its program. The shared sources are OpenCL C (ops/kernels/*.cl) read through
// prelude_cuda.cuh; below them, the one kernel only CUDA needs.
#include "tessera/ops/kernels/prelude_cuda.cuh"

#include "tessera/ops/kernels/dtype.cl"
#include "tessera/ops/kernels/common.cl"
#include "tessera/ops/kernels/embedding.cl"
#include "tessera/ops/kernels/layernorm.cl"
#include "tessera/ops/kernels/elementwise.cl"
#include "tessera/ops/kernels/attention.cl"
#include "tessera/ops/kernels/cross_entropy.cl"
#include "tessera/ops/kernels/optimizer.cl"
#include "tessera/ops/kernels/sum_squares.cl"
#include "tessera/ops/kernels/fp64.cl"

// The 16-bit GEMM operands of cuBLASLt: dst = the bfloat16 (mode 1) or half (mode 2) bits
// of a rows x cols block of src with leading dimension ld (dst contiguous), rounded as
// dtype.cl's bf16_bits / fp16_bits, so a cuBLASLt bf16 GEMM multiplies the operands the
// other backends multiply. Work-item (c, r).
__kernel void pack_16bit(__global unsigned short* dst, __global const float* src, ulong src_off, long cols, long ld,
                         int mode) {
  const long c = get_global_id(0), r = get_global_id(1);
  const float v = src[src_off + r * ld + c];
  dst[r * cols + c] = (unsigned short)(mode == 1 ? bf16_bits(v) : fp16_bits(v));
}
