// The residual add. Trivial, but a kernel of its own so every backend has it and the
// model never touches raw pointers.
#include "tessera/ops/cpu/cpu_ops.h"

namespace tessera::ops::cpu {

void residual_forward(Tensor out, Tensor a, Tensor b) {
  const int64_t n = out.numel();
  TESSERA_CHECK(a.numel() == n && b.numel() == n, "residual: out " + shape_str(out.shape) + ", a " +
                                                      shape_str(a.shape) + ", b " + shape_str(b.shape));
  const float* x = f32(a);
  const float* y = f32(b);
  float* o = f32(out);
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < n; ++i) o[i] = x[i] + y[i];
}

void residual_backward(Tensor da, Tensor db, Tensor dout) {
  const int64_t n = dout.numel();
  const float* g = f32(dout);
  float* ga = da.empty() ? nullptr : f32(da);
  float* gb = db.empty() ? nullptr : f32(db);
  // Accumulating a buffer into itself would double it; a caller whose gradient already
  // lives in dout (the residual stream) simply does not pass it.
  TESSERA_CHECK(ga != g && gb != g, "residual backward: a gradient output aliases dout");
  if (ga) TESSERA_CHECK(da.numel() == n, "residual backward: da " + shape_str(da.shape));
  if (gb) TESSERA_CHECK(db.numel() == n, "residual backward: db " + shape_str(db.shape));
  if (ga && gb) {
#pragma omp parallel for simd schedule(static)
    for (int64_t i = 0; i < n; ++i) {
      ga[i] += g[i];
      gb[i] += g[i];
    }
  } else if (ga || gb) {
    float* d = ga ? ga : gb;
#pragma omp parallel for simd schedule(static)
    for (int64_t i = 0; i < n; ++i) d[i] += g[i];
  }
}

}  // namespace tessera::ops::cpu
