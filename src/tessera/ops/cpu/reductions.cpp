// Reductions for the optimizer: squared norms (for global-norm clipping) and scaling, on
// tensors of any float dtype (staged in chunks, storage.h); the sums stay in double.
#include <algorithm>
#include <vector>

#include "tessera/ops/cpu/cpu_ops.h"
#include "tessera/ops/cpu/storage.h"

namespace tessera::ops::cpu {

void sum_squares(Tensor sums, int64_t slot, Tensor t) {
  TESSERA_CHECK(slot >= 0 && slot < sums.numel(),
                "sum_squares: slot " + std::to_string(slot) + " outside sums " + shape_str(sums.shape));
  check_float(t, "sum_squares", "t");
  double* out = f64(sums);
  const int64_t n = t.numel();
  // Fixed chunks, each summed in double, then the chunk sums added in order: the result
  // depends only on the data, never on the thread count or schedule.
  constexpr int64_t kChunk = 1 << 16;
  const int64_t chunks = (n + kChunk - 1) / kChunk;
  std::vector<double> partial(static_cast<size_t>(chunks));
#pragma omp parallel for schedule(static)
  for (int64_t c = 0; c < chunks; ++c) {
    const int64_t len = std::min(kChunk, n - c * kChunk);
    Stage stage;
    const float* x = stage.in(t, c * kChunk, len);
    // 32 double accumulators (four AVX-512 registers): four independent FMA chains, so
    // the loop runs at memory speed instead of waiting on one chain's latency.
    constexpr int64_t kLanes = 32;
    double acc[kLanes] = {};
    int64_t i = 0;
    for (; i + kLanes <= len; i += kLanes) {
#pragma omp simd
      for (int64_t j = 0; j < kLanes; ++j) acc[j] += static_cast<double>(x[i + j]) * x[i + j];
    }
    for (; i < len; ++i) acc[0] += static_cast<double>(x[i]) * x[i];
    double s = 0.0;
    for (int64_t j = 0; j < kLanes; ++j) s += acc[j];
    partial[static_cast<size_t>(c)] = s;
  }
  double total = 0.0;
  for (double s : partial) total += s;
  out[slot] += total;
}

void scale_inplace(Tensor t, float scale) {
  check_float(t, "scale_inplace", "t");
  for_chunks(t.numel(), [&](int64_t off, int64_t len) {
    Stage s;
    float* x = s.inout(t, off, len);
#pragma omp simd
    for (int64_t i = 0; i < len; ++i) x[i] *= scale;
    s.done(t, off, len, x);
  });
}

}  // namespace tessera::ops::cpu
