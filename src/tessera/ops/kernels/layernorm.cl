// LayerNorm over the last dimension (ops/cpu/layernorm.cpp): two-pass mean and variance.

// One work-item per row.
__kernel void layernorm_forward(__global float* out, ulong out_off, __global float* mean, ulong mean_off,
                                __global float* rstd, ulong rstd_off, __global const float* inp, ulong inp_off,
                                __global const float* weight, ulong w_off, __global const float* bias, ulong b_off,
                                long C, float eps) {
  const long n = get_global_id(0);
  __global const float* x = inp + inp_off + n * C;
  float sum = 0.0f;
  for (long c = 0; c < C; ++c) sum += x[c];
  const float mu = sum / (float)C;
  float sq = 0.0f;
  for (long c = 0; c < C; ++c) {
    const float d = x[c] - mu;
    sq += d * d;
  }
  const float rs = 1.0f / sqrt(sq / (float)C + eps);
  __global float* y = out + out_off + n * C;
  for (long c = 0; c < C; ++c) {
    const float v = (x[c] - mu) * rs * weight[w_off + c];
    y[c] = bias ? v + bias[b_off + c] : v;
  }
  if (mean) mean[mean_off + n] = mu;
  if (rstd) rstd[rstd_off + n] = rs;
}

// dinp += rstd * (g - mean(g) - xhat * mean(g * xhat)), g = dout * weight; one work-item per row.
__kernel void layernorm_backward_input(__global float* dinp, ulong dinp_off, __global const float* dout,
                                       ulong dout_off, __global const float* inp, ulong inp_off,
                                       __global const float* weight, ulong w_off, __global const float* mean,
                                       ulong mean_off, __global const float* rstd, ulong rstd_off, long C) {
  const long n = get_global_id(0);
  __global const float* x = inp + inp_off + n * C;
  __global const float* dy = dout + dout_off + n * C;
  __global const float* w = weight + w_off;
  const float m = mean[mean_off + n], r = rstd[rstd_off + n];
  float g_sum = 0.0f, gx_sum = 0.0f;
  for (long c = 0; c < C; ++c) {
    const float g = dy[c] * w[c];
    g_sum += g;
    gx_sum += g * ((x[c] - m) * r);
  }
  const float g_mean = g_sum / (float)C, gx_mean = gx_sum / (float)C;
  __global float* dx = dinp + dinp_off + n * C;
  for (long c = 0; c < C; ++c) {
    const float xhat = (x[c] - m) * r;
    dx[c] += (dy[c] * w[c] - g_mean - xhat * gx_mean) * r;
  }
}

// dweight += sum over rows of dout * xhat, dbias += sum of dout; one work-item per channel.
__kernel void layernorm_backward_params(__global float* dweight, ulong dw_off, __global float* dbias, ulong db_off,
                                        __global const float* dout, ulong dout_off, __global const float* inp,
                                        ulong inp_off, __global const float* mean, ulong mean_off,
                                        __global const float* rstd, ulong rstd_off, long C, long N) {
  const long c = get_global_id(0);
  float acc_w = 0.0f, acc_b = 0.0f;
  for (long n = 0; n < N; ++n) {
    const float dy = dout[dout_off + n * C + c];
    acc_w += dy * ((inp[inp_off + n * C + c] - mean[mean_off + n]) * rstd[rstd_off + n]);
    acc_b += dy;
  }
  if (dweight) dweight[dw_off + c] += acc_w;
  if (dbias) dbias[db_off + c] += acc_b;
}
