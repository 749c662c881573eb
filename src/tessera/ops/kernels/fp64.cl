// The kernels that need doubles (cl_khr_fp64), built into the fp64 program after
// core/philox.h and sum_squares.cl: each reproduces its CPU kernel's order of operations
// (ops/cpu/reductions.cpp, loss.cpp, init.cpp), so the results have the CPU's bits. The
// tensors of doubles are ops.h's I64 tensors holding doubles. No contraction into FMAs:
// the CPU kernels round every product as written.
#ifdef __OPENCL_VERSION__
#pragma OPENCL FP_CONTRACT OFF  // nvcc: --fmad=false (ops/cuda/CMakeLists.txt)
#endif

// ops.h masked_loss_sums: one work-item, in index order (N is a micro-batch's tokens).
__kernel void masked_loss_sums(__global double* sums, ulong sums_off, __global const float* losses, ulong losses_off,
                               __global const float* mask, ulong mask_off, long n) {
  double loss_sum = 0.0, mask_sum = 0.0;
  for (long i = 0; i < n; ++i) {
    const float m = mask[mask_off + i];
    loss_sum += (double)losses[losses_off + i] * (double)m;
    mask_sum += (double)m;
  }
  sums[sums_off] += loss_sum;
  sums[sums_off + 1] += mask_sum;
}

// ops.h init_normal: one work-item per element.
__kernel void init_normal(FLOATS(out), float std, uint seed, uint tensor_id, long first,
                          long cols, long full_cols) {
  const long e = get_global_id(0);
  const long full = first + (e / cols) * full_cols + e % cols;
  STORE(out, e, std * tessera_philox_normal(seed, tensor_id, (ulong)full));
}
