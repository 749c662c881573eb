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

// multi_tensor_sum_squares: work-item (lane, chunk) computes sum_squares_lanes' accumulator
// `lane` of chunk c of the table (multi_tensor.cl), whose rows are the segments' 65536-element
// chunks, so every segment gets its own sum_squares lanes.
__kernel void multi_tensor_sum_squares_lanes(__global double* partial, ulong partial_off, __global const float* grad,
                                             ulong grad_off, __global const long* chunks, ulong chunks_off) {
  const long j = get_global_id(0), c = get_global_id(1);
  __global const long* row = chunks + chunks_off + c * CHUNK_COLUMNS;
  __global const float* x = grad + grad_off + row[CHUNK_GRAD];
  const long len = row[CHUNK_NUMEL], full = len / SQ_LANES * SQ_LANES;
  double acc = 0.0;
  for (long i = j; i < full; i += SQ_LANES) {
    const double xi = x[i];
    acc += xi * xi;
  }
  if (j == 0)
    for (long i = full; i < len; ++i) {
      const double xi = x[i];
      acc += xi * xi;
    }
  partial[partial_off + c * SQ_LANES + j] = acc;
}

// Work-item c, on a segment's first chunk: sums[slot] += the segment's chunk sums, added as
// sum_squares_add adds a tensor's (each chunk's 32 accumulators in order, then the chunks in
// order). Segments add into distinct slots, so the work-items never write the same one.
__kernel void multi_tensor_sum_squares_add(__global double* sums, ulong sums_off, __global const double* partial,
                                           ulong partial_off, __global const long* chunks, ulong chunks_off) {
  const long c = get_global_id(0);
  __global const long* row = chunks + chunks_off + c * CHUNK_COLUMNS;
  const long count = row[CHUNK_SEGMENT];
  if (count == 0) return;
  double total = 0.0;
  for (long k = c; k < c + count; ++k) {
    double s = 0.0;
    for (long j = 0; j < SQ_LANES; ++j) s += partial[partial_off + k * SQ_LANES + j];
    total += s;
  }
  sums[sums_off + row[CHUNK_SLOT]] += total;
}

// ops.h grad_norm_finish (the CPU's arithmetic in ops/cpu/reductions.cpp, in double). One
// work-item.
__kernel void grad_norm_finish(__global double* result, ulong result_off, __global float* s, ulong s_off,
                               __global const double* sums, ulong sums_off, long slots, float clip_grad) {
  double total = 0.0;
  for (long i = 0; i < slots; ++i) total += sums[sums_off + i];
  s += s_off;
  const double loss_scale = s[SCALAR_LOSS_SCALE];
  const double norm = sqrt(total) / loss_scale;
  double coeff = 1.0;
  if (clip_grad > 0.0f) {
    const double c = clip_grad / (norm + 1e-6);
    coeff = c < 1.0 ? c : 1.0;
  }
  s[SCALAR_GRAD_SCALE] = (float)(coeff / loss_scale);
  result[result_off] = norm;
  result[result_off + 1] = isfinite(total) ? 0.0 : 1.0;
}
