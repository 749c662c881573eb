// The mixture of experts' row movement (ops/cpu/moe.cpp): tokens into expert order and back
// with their routing weights. Maps are ops.inc's slots [N,k] and sources [M] (-1: none). Each
// sum runs in route order from the same start as the CPU's, so the Exact ones give its bits.

// One work-item per element (c, m) of out [M,C].
__kernel void moe_permute_forward(FLOATS(out), CONST_FLOATS(inp), __global const int* sources, ulong sources_off,
                                  long C, long topk) {
  const long c = get_global_id(0), m = get_global_id(1);
  const int r = sources[sources_off + m];
  STORE(out, m * C + c, r < 0 ? 0.0f : LOAD(inp, (r / topk) * C + c));
}

// One work-item per element (c, n) of dinp [N,C].
__kernel void moe_permute_backward(FLOATS(dinp), CONST_FLOATS(dout), __global const int* slots, ulong slots_off,
                                   long C, long k, int assign) {
  const long c = get_global_id(0), n = get_global_id(1);
  float d = assign ? 0.0f : LOAD(dinp, n * C + c);
  for (long j = 0; j < k; ++j) {
    const int m = slots[slots_off + n * k + j];
    if (m >= 0) d += LOAD(dout, m * C + c);
  }
  STORE(dinp, n * C + c, d);
}

// One work-item per element (c, n) of out [N,C].
__kernel void moe_unpermute_forward(FLOATS(out), CONST_FLOATS(inp), __global const int* slots, ulong slots_off,
                                    __global const float* weights, ulong weights_off, long C, long k) {
  const long c = get_global_id(0), n = get_global_id(1);
  float o = 0.0f;
  for (long j = 0; j < k; ++j) {
    const int m = slots[slots_off + n * k + j];
    if (m >= 0) o += weights[weights_off + n * k + j] * LOAD(inp, m * C + c);
  }
  STORE(out, n * C + c, o);
}

// One work-item per permuted row m: dinp's row and its route's weight gradient (dweights was
// zeroed first; each route has at most one row).
__kernel void moe_unpermute_backward(FLOATS(dinp), __global float* dweights, ulong dweights_off, CONST_FLOATS(dout),
                                     CONST_FLOATS(inp), __global const int* sources, ulong sources_off,
                                     __global const float* weights, ulong weights_off, long C, long k) {
  const long m = get_global_id(0);
  const int r = sources[sources_off + m];
  if (r < 0) {
    for (long c = 0; c < C; ++c) STORE(dinp, m * C + c, 0.0f);
    return;
  }
  const float w = weights[weights_off + r];
  const long n = r / k;
  float dot = 0.0f;
  for (long c = 0; c < C; ++c) {
    const float g = LOAD(dout, n * C + c);
    STORE(dinp, m * C + c, w * g);
    dot += g * LOAD(inp, m * C + c);
  }
  dweights[dweights_off + r] = dot;
}
