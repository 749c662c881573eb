// Sum of squares in double (ops/cpu/reductions.cpp), built as its own program because it
// needs cl_khr_fp64. The CPU sums fixed chunks of 65536 elements, each in 32 double
// accumulators (element i of a full 32-block to accumulator i % 32, the tail to
// accumulator 0), then the accumulators and the chunks in order. Work-item (lane, chunk)
// computes one accumulator; sum_squares_add adds them in the same order, so the result has
// the CPU's bits (a float's square is exact in double, so FMA or not does not matter).
#pragma OPENCL EXTENSION cl_khr_fp64 : enable
#define SQ_CHUNK 65536
#define SQ_LANES 32

__kernel void sum_squares_lanes(__global double* partial, CONST_FLOATS(x), long n) {
  const long j = get_global_id(0), c = get_global_id(1);
  const long i0 = c * SQ_CHUNK, i1 = min(n, i0 + SQ_CHUNK);
  const long full = i0 + (i1 - i0) / SQ_LANES * SQ_LANES;
  double acc = 0.0;
  for (long i = i0 + j; i < full; i += SQ_LANES) {
    const double xi = LOAD(x, i);
    acc += xi * xi;
  }
  if (j == 0)
    for (long i = full; i < i1; ++i) {
      const double xi = LOAD(x, i);
      acc += xi * xi;
    }
  partial[c * SQ_LANES + j] = acc;
}

// sums[slot] += the chunk sums of sum_squares_lanes, added as the CPU adds them: the 32
// accumulators of each chunk in order, then the chunks in order. One work-item.
__kernel void sum_squares_add(__global double* sums, ulong sums_off, long slot, __global const double* partial,
                              long chunks) {
  double total = 0.0;
  for (long c = 0; c < chunks; ++c) {
    double s = 0.0;
    for (long j = 0; j < SQ_LANES; ++j) s += partial[c * SQ_LANES + j];
    total += s;
  }
  sums[sums_off + slot] += total;
}
