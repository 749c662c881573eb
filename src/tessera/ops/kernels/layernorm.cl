// The normalisations over the last dimension: LayerNorm (ops/cpu/layernorm.cpp, two-pass mean
// and variance) and RMSNorm (ops/cpu/rmsnorm.cpp).

// One work-item per row.
__kernel void layernorm_forward(FLOATS(out), __global float* mean, ulong mean_off, __global float* rstd,
                                ulong rstd_off, CONST_FLOATS(inp), CONST_FLOATS(weight), CONST_FLOATS(bias), long C,
                                float eps) {
  const long n = get_global_id(0), x = n * C;  // x: the row's first element
  float sum = 0.0f;
  for (long c = 0; c < C; ++c) sum += LOAD(inp, x + c);
  const float mu = sum / (float)C;
  float sq = 0.0f;
  for (long c = 0; c < C; ++c) {
    const float d = LOAD(inp, x + c) - mu;
    sq += d * d;
  }
  const float rs = 1.0f / sqrt(sq / (float)C + eps);
  for (long c = 0; c < C; ++c) {
    const float v = (LOAD(inp, x + c) - mu) * rs * LOAD(weight, c);
    STORE(out, x + c, bias ? v + LOAD(bias, c) : v);
  }
  if (mean) mean[mean_off + n] = mu;
  if (rstd) rstd[rstd_off + n] = rs;
}

// dinp (+)= rstd * (g - mean(g) - xhat * mean(g * xhat)), g = dout * weight; one work-item per row.
__kernel void layernorm_backward_input(FLOATS(dinp), CONST_FLOATS(dout), CONST_FLOATS(inp), CONST_FLOATS(weight),
                                       __global const float* mean, ulong mean_off, __global const float* rstd,
                                       ulong rstd_off, long C, int assign) {
  const long n = get_global_id(0), x = n * C;  // x: the row's first element
  const float m = mean[mean_off + n], r = rstd[rstd_off + n];
  float g_sum = 0.0f, gx_sum = 0.0f;
  for (long c = 0; c < C; ++c) {
    const float g = LOAD(dout, x + c) * LOAD(weight, c);
    g_sum += g;
    gx_sum += g * ((LOAD(inp, x + c) - m) * r);
  }
  const float g_mean = g_sum / (float)C, gx_mean = gx_sum / (float)C;
  for (long c = 0; c < C; ++c) {
    const float xhat = (LOAD(inp, x + c) - m) * r;
    GRAD_TO(dinp, x + c, (LOAD(dout, x + c) * LOAD(weight, c) - g_mean - xhat * gx_mean) * r, assign);
  }
}

// dweight += sum over rows of dout * xhat, dbias += sum of dout; one work-item per channel.
__kernel void layernorm_backward_params(FLOATS(dweight), FLOATS(dbias), CONST_FLOATS(dout), CONST_FLOATS(inp),
                                        __global const float* mean, ulong mean_off, __global const float* rstd,
                                        ulong rstd_off, long C, long N) {
  const long c = get_global_id(0);
  float acc_w = 0.0f, acc_b = 0.0f;
  for (long n = 0; n < N; ++n) {
    const float dy = LOAD(dout, n * C + c);
    acc_w += dy * ((LOAD(inp, n * C + c) - mean[mean_off + n]) * rstd[rstd_off + n]);
    acc_b += dy;
  }
  if (dweight) ADD_TO(dweight, c, acc_w);
  if (dbias) ADD_TO(dbias, c, acc_b);
}

// RMSNorm: out = inp * rstd * weight, rstd = 1 / sqrt(mean(inp^2) + eps); one work-item per row.
__kernel void rmsnorm_forward(FLOATS(out), __global float* rstd, ulong rstd_off, CONST_FLOATS(inp),
                              CONST_FLOATS(weight), long C, float eps) {
  const long n = get_global_id(0), x = n * C;  // x: the row's first element
  float sq = 0.0f;
  for (long c = 0; c < C; ++c) {
    const float v = LOAD(inp, x + c);
    sq += v * v;
  }
  const float rs = 1.0f / sqrt(sq / (float)C + eps);
  for (long c = 0; c < C; ++c) STORE(out, x + c, LOAD(inp, x + c) * rs * LOAD(weight, c));
  if (rstd) rstd[rstd_off + n] = rs;
}

// dinp (+)= rstd * (g - xhat * mean(g * xhat)), g = dout * weight, xhat = inp * rstd; one
// work-item per row.
__kernel void rmsnorm_backward_input(FLOATS(dinp), CONST_FLOATS(dout), CONST_FLOATS(inp), CONST_FLOATS(weight),
                                     __global const float* rstd, ulong rstd_off, long C, int assign) {
  const long n = get_global_id(0), x = n * C;  // x: the row's first element
  const float r = rstd[rstd_off + n];
  float gx_sum = 0.0f;
  for (long c = 0; c < C; ++c) gx_sum += LOAD(dout, x + c) * LOAD(weight, c) * (LOAD(inp, x + c) * r);
  const float gx_mean = gx_sum / (float)C;
  for (long c = 0; c < C; ++c)
    GRAD_TO(dinp, x + c, (LOAD(dout, x + c) * LOAD(weight, c) - LOAD(inp, x + c) * r * gx_mean) * r, assign);
}

// dweight += sum over rows of dout * xhat; one work-item per channel, rows in order.
__kernel void rmsnorm_backward_weight(FLOATS(dweight), CONST_FLOATS(dout), CONST_FLOATS(inp),
                                      __global const float* rstd, ulong rstd_off, long C, long N) {
  const long c = get_global_id(0);
  float acc = 0.0f;
  for (long n = 0; n < N; ++n) acc += LOAD(dout, n * C + c) * (LOAD(inp, n * C + c) * rstd[rstd_off + n]);
  ADD_TO(dweight, c, acc);
}
