// Compiled with --fmad=false (ops/cuda/CMakeLists.txt): AdamW's update is Exact, every
// operation rounded as written, as optimizer.cl's and the CPU's.
#include "tessera/ops/cuda/multi_tensor_kernels.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "tessera/ops/cuda/element_math.h"

namespace tessera::ops::cuda::native {
namespace {

// multi_tensor.cl's chunk table columns and step scalars (optimizer_updates_host.inc checks
// them against ops.h).
constexpr int kMain = 0, kParam = 1, kGrad = 2, kState = 3, kNumel = 4, kDecay = 5, kSlot = 6, kSegment = 7,
              kColumns = 8;
constexpr int kGradScale = 7, kAdamDecay = 3, kAdamStepSize = 4, kAdamBc2Sqrt = 5;
constexpr int kChunk = 65536;   // the table's chunk length (ops.h kChunkElements)
constexpr int kThreads = 256;
constexpr int kPerThread = 4;   // one float4

template <typename P>
__device__ inline void store_param(void* params, int64_t i, float x);
template <>
__device__ inline void store_param<void>(void*, int64_t, float) {}
template <>
__device__ inline void store_param<__nv_bfloat16>(void* params, int64_t i, float x) {
  static_cast<__nv_bfloat16*>(params)[i] = __float2bfloat16_rn(x);
}
template <>
__device__ inline void store_param<__half>(void* params, int64_t i, float x) {
  static_cast<__half*>(params)[i] = __float2half_rn(x);
}

// Block (chunk, y): elements [y * 1024, y * 1024 + 1024) of the chunk, four per thread, as one
// float4 of each array when the chunk's offsets are multiples of four. Chunks on grid.x, whose
// limit (2^31 - 1) no slab reaches.
template <typename P>
__global__ void adamw_kernel(AdamwArgs a) {
  const int64_t* row = a.chunks + static_cast<int64_t>(blockIdx.x) * kColumns;
  const int64_t n = row[kNumel];
  const int64_t first = (static_cast<int64_t>(blockIdx.y) * kThreads + threadIdx.x) * kPerThread;
  if (first >= n) return;
  const AdamwStep step{row[kDecay] ? a.scalars[kAdamDecay] : 1.0f,
                       a.scalars[kGradScale],
                       a.w1,
                       a.w1c,
                       a.beta2,
                       a.w2,
                       a.scalars[kAdamStepSize],
                       a.scalars[kAdamBc2Sqrt],
                       a.eps,
                       a.lerp_low};
  float* p = a.mains + row[kMain] + first;
  const float* g = a.grad + row[kGrad] + first;
  float* m = a.m + row[kState] + first;
  float* v = a.v + row[kState] + first;
  const int64_t param0 = row[kParam] + first;
  const bool vector =
      a.aligned && first + kPerThread <= n && (row[kMain] | row[kGrad] | row[kState]) % kPerThread == 0;
  if (vector) {
    float4 pv = *reinterpret_cast<float4*>(p), mv = *reinterpret_cast<float4*>(m), vv = *reinterpret_cast<float4*>(v);
    const float4 gv = *reinterpret_cast<const float4*>(g);
    pv.x = step(pv.x, mv.x, vv.x, gv.x);
    pv.y = step(pv.y, mv.y, vv.y, gv.y);
    pv.z = step(pv.z, mv.z, vv.z, gv.z);
    pv.w = step(pv.w, mv.w, vv.w, gv.w);
    *reinterpret_cast<float4*>(p) = pv;
    *reinterpret_cast<float4*>(m) = mv;
    *reinterpret_cast<float4*>(v) = vv;
    store_param<P>(a.params, param0, pv.x);
    store_param<P>(a.params, param0 + 1, pv.y);
    store_param<P>(a.params, param0 + 2, pv.z);
    store_param<P>(a.params, param0 + 3, pv.w);
    return;
  }
  for (int64_t k = 0; k < kPerThread && first + k < n; ++k) {
    p[k] = step(p[k], m[k], v[k], g[k]);
    store_param<P>(a.params, param0 + k, p[k]);
  }
}

// Block c: the sum of squares of chunk c in double, each thread's strided elements then a
// fixed tree over the block, into partial[c].
__global__ void chunk_squares_kernel(double* partial, const float* grad, const int64_t* chunks) {
  const int64_t* row = chunks + static_cast<int64_t>(blockIdx.x) * kColumns;
  const float* x = grad + row[kGrad];
  const int64_t n = row[kNumel];
  double acc = 0.0;
  for (int64_t i = threadIdx.x; i < n; i += kThreads) {
    const double xi = x[i];
    acc += xi * xi;
  }
  __shared__ double tree[kThreads];
  tree[threadIdx.x] = acc;
  __syncthreads();
  for (int half = kThreads / 2; half > 0; half /= 2) {
    if (threadIdx.x < half) tree[threadIdx.x] += tree[threadIdx.x + half];
    __syncthreads();
  }
  if (threadIdx.x == 0) partial[blockIdx.x] = tree[0];
}

// Thread c, on a segment's first chunk: sums[slot] += its chunks' partials in order.
__global__ void segment_add_kernel(double* sums, const double* partial, const int64_t* chunks, int64_t rows) {
  const int64_t c = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (c >= rows) return;
  const int64_t* row = chunks + c * kColumns;
  const int64_t count = row[kSegment];
  if (count == 0) return;
  double total = 0.0;
  for (int64_t k = c; k < c + count; ++k) total += partial[k];
  sums[row[kSlot]] += total;
}

}  // namespace

void multi_tensor_adamw(const AdamwArgs& a, cudaStream_t stream) {
  if (a.rows == 0) return;
  const dim3 grid(static_cast<unsigned>(a.rows), kChunk / (kThreads * kPerThread));
  switch (a.param_type) {
    case ParamType::None: adamw_kernel<void><<<grid, kThreads, 0, stream>>>(a); break;
    case ParamType::BF16: adamw_kernel<__nv_bfloat16><<<grid, kThreads, 0, stream>>>(a); break;
    case ParamType::F16: adamw_kernel<__half><<<grid, kThreads, 0, stream>>>(a); break;
  }
}

void multi_tensor_sum_squares(double* sums, double* partial, const float* grad, const int64_t* chunks, int64_t rows,
                              cudaStream_t stream) {
  if (rows == 0) return;
  chunk_squares_kernel<<<static_cast<unsigned>(rows), kThreads, 0, stream>>>(partial, grad, chunks);
  segment_add_kernel<<<static_cast<unsigned>((rows + kThreads - 1) / kThreads), kThreads, 0, stream>>>(
      sums, partial, chunks, rows);
}

}  // namespace tessera::ops::cuda::native
