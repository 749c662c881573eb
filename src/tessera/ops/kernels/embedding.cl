// Token + position embedding (ops/cpu/embedding.cpp). Indices were checked on the host.

// One work-item per (channel c, row n).
__kernel void embedding_forward(__global float* out, ulong out_off, __global const int* tokens, ulong tok_off,
                                __global const int* positions, ulong pos_off, __global const float* wte,
                                ulong wte_off, __global const float* wpe, ulong wpe_off, long C, long vocab_start,
                                long vocab_rows) {
  const long c = get_global_id(0), n = get_global_id(1);
  float v = 0.0f;
  if (wte) {
    const long tok = tokens[tok_off + n];
    if (tok >= vocab_start && tok - vocab_start < vocab_rows) v = wte[wte_off + (tok - vocab_start) * C + c];
  }
  if (wpe) v += wpe[wpe_off + (long)positions[pos_off + n] * C + c];
  out[out_off + n * C + c] = v;
}

// One work-item per channel, walking the rows in order: no two work-items add to the same
// element (rows repeat tokens), and each element sums its rows in the CPU's order.
__kernel void embedding_backward(__global float* dwte, ulong dwte_off, __global float* dwpe, ulong dwpe_off,
                                 __global const float* dout, ulong dout_off, __global const int* tokens,
                                 ulong tok_off, __global const int* positions, ulong pos_off, long C, long N,
                                 long vocab_start, long vocab_rows) {
  const long c = get_global_id(0);
  for (long n = 0; n < N; ++n) {
    const float g = dout[dout_off + n * C + c];
    if (dwte) {
      const long tok = tokens[tok_off + n];
      if (tok >= vocab_start && tok - vocab_start < vocab_rows) dwte[dwte_off + (tok - vocab_start) * C + c] += g;
    }
    if (dwpe) dwpe[dwpe_off + (long)positions[pos_off + n] * C + c] += g;
  }
}
