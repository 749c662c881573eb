// The residual add. Trivial, but a kernel of its own so every backend has it and the
// model never touches raw pointers. Tensors of any float dtype, staged in chunks
// (storage.h).
#include "tessera/ops/cpu/cpu_ops.h"
#include "tessera/ops/cpu/storage.h"

namespace tessera::ops::cpu {

void residual_forward(Tensor out, Tensor a, Tensor b) {
  const int64_t n = out.numel();
  TESSERA_CHECK(a.numel() == n && b.numel() == n, "residual: out " + shape_str(out.shape) + ", a " +
                                                      shape_str(a.shape) + ", b " + shape_str(b.shape));
  check_float(out, "residual_forward", "out");
  check_float(a, "residual_forward", "a");
  check_float(b, "residual_forward", "b");
  for_chunks(n, [&](int64_t off, int64_t len) {
    Stage s;
    const float* x = s.in(a, off, len);
    const float* y = s.in(b, off, len);
    float* o = s.out(out, off, len);
#pragma omp simd
    for (int64_t i = 0; i < len; ++i) o[i] = x[i] + y[i];
    s.done(out, off, len, o);
  });
}

void residual_backward(Tensor da, Tensor db, Tensor dout) {
  const int64_t n = dout.numel();
  check_float(da, "residual_backward", "da");
  check_float(db, "residual_backward", "db");
  check_float(dout, "residual_backward", "dout");
  // Accumulating a buffer into itself would double it; a caller whose gradient already
  // lives in dout (the residual stream) simply does not pass it.
  const char* g0 = cpu_memory(dout);
  TESSERA_CHECK(cpu_memory(da) != g0 && cpu_memory(db) != g0, "residual backward: a gradient output aliases dout");
  if (!da.empty()) TESSERA_CHECK(da.numel() == n, "residual backward: da " + shape_str(da.shape));
  if (!db.empty()) TESSERA_CHECK(db.numel() == n, "residual backward: db " + shape_str(db.shape));
  for_chunks(n, [&](int64_t off, int64_t len) {
    Stage s;
    const float* g = s.in(dout, off, len);
    for (const Tensor* d : {&da, &db}) {
      if (d->empty()) continue;
      float* acc = s.inout(*d, off, len);
#pragma omp simd
      for (int64_t i = 0; i < len; ++i) acc[i] += g[i];
      s.done(*d, off, len, acc);
    }
  });
}

}  // namespace tessera::ops::cpu
