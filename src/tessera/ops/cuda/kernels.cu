// Every kernel of the CUDA backend, compiled by nvcc into one fatbin (ops/cuda/CMakeLists.txt)
// that cuda_launch.cpp loads and looks kernels up in by name, as the OpenCL backend does
// with its program. The sources are OpenCL C (ops/kernels/*.cl) read through
// prelude_cuda.cuh, then the CUDA-only ones (ops/cuda/*.cuh).
#include "tessera/ops/kernels/prelude_cuda.cuh"

#include "tessera/ops/kernels/dtype.cl"
#include "tessera/ops/kernels/common.cl"
#include "tessera/ops/kernels/embedding.cl"
#include "tessera/ops/kernels/layernorm.cl"
#include "tessera/ops/kernels/elementwise.cl"
#include "tessera/ops/kernels/attention.cl"
#include "tessera/ops/kernels/flash_attention.cl"
#include "tessera/ops/kernels/cross_entropy.cl"
#include "tessera/ops/kernels/multi_tensor.cl"
#include "tessera/ops/kernels/optimizer.cl"
#include "tessera/ops/kernels/sum_squares.cl"
#include "tessera/ops/kernels/fp64.cl"
#include "tessera/ops/kernels/moe.cl"

#include "tessera/ops/cuda/block_reduce.cuh"
#include "tessera/ops/cuda/attention_kernels.cuh"
#include "tessera/ops/cuda/row_kernels.cuh"
