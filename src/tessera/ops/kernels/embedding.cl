// Token + position embedding (ops/cpu/embedding.cpp). The ids are not checked here (ops.h:
// who checks the ids), but every access stays in bounds: a token outside the shard or a
// position outside wpe's rows adds nothing.

// One work-item per (channel c, row n).
__kernel void embedding_forward(FLOATS(out), __global const int* tokens, ulong tok_off,
                                __global const int* positions, ulong pos_off, CONST_FLOATS(wte), CONST_FLOATS(wpe),
                                long C, long vocab_start, long vocab_rows, long pos_rows) {
  const long c = get_global_id(0), n = get_global_id(1);
  float v = 0.0f;
  if (wte) {
    const long tok = tokens[tok_off + n];
    if (tok >= vocab_start && tok - vocab_start < vocab_rows) v = LOAD(wte, (tok - vocab_start) * C + c);
  }
  if (wpe) {
    const long pos = positions[pos_off + n];
    if (pos >= 0 && pos < pos_rows) v += LOAD(wpe, pos * C + c);
  }
  STORE(out, n * C + c, v);
}

// One work-item per channel, walking the rows in order: no two work-items add to the same
// element (rows repeat tokens), and each element sums its rows in the CPU's order.
__kernel void embedding_backward(FLOATS(dwte), FLOATS(dwpe), CONST_FLOATS(dout), __global const int* tokens,
                                 ulong tok_off, __global const int* positions, ulong pos_off, long C, long N,
                                 long vocab_start, long vocab_rows, long pos_rows) {
  const long c = get_global_id(0);
  for (long n = 0; n < N; ++n) {
    const float g = LOAD(dout, n * C + c);
    if (dwte) {
      const long tok = tokens[tok_off + n];
      if (tok >= vocab_start && tok - vocab_start < vocab_rows) ADD_TO(dwte, (tok - vocab_start) * C + c, g);
    }
    if (dwpe) {
      const long pos = positions[pos_off + n];
      if (pos >= 0 && pos < pos_rows) ADD_TO(dwpe, pos * C + c, g);
    }
  }
}
