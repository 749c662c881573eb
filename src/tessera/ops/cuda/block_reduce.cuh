// The reduction of the CUDA-only row kernels (attention_kernels.cuh, row_kernels.cuh): one
// value per thread of a block combined over the whole block. Deterministic: the same
// blockDim combines the same values in the same tree, whatever the timing.

// The max (max_not_sum) or the sum of v over the thread block, returned to every thread
// (blockDim.x a multiple of 32, at most 1024; every thread of the block must call it). Inline:
// several .cu files of the library include it.
__device__ inline float block_reduce(float v, bool max_not_sum) {
  __shared__ float warps[32];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, nwarps = blockDim.x / 32;
  for (int o = 16; o > 0; o /= 2) {
    const float other = __shfl_xor_sync(0xffffffffu, v, o);
    v = max_not_sum ? fmaxf(v, other) : v + other;
  }
  __syncthreads();  // an earlier reduction's readers are done with warps
  if (lane == 0) warps[warp] = v;
  __syncthreads();
  v = lane < nwarps ? warps[lane] : (max_not_sum ? -INFINITY : 0.0f);
  for (int o = 16; o > 0; o /= 2) {
    const float other = __shfl_xor_sync(0xffffffffu, v, o);
    v = max_not_sum ? fmaxf(v, other) : v + other;
  }
  return v;
}
