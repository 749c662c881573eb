// Parameter initialisation on the device (ops.h init_normal, fill): Megatron's normal init
// drawn from core/philox.h, the source every backend compiles, so each backend and each
// layout holds the same weights.
#include <algorithm>

#include "tessera/core/philox.h"
#include "tessera/ops/cpu/cpu_ops.h"

namespace tessera::ops::cpu {

void init_normal(Tensor out, float std, uint32_t seed, uint32_t tensor_id, ShardIndex where) {
  float* p = f32(out);
  const int64_t n = out.numel();
  TESSERA_CHECK(where.cols > 0, "init_normal: ShardIndex.cols must be positive");
#pragma omp parallel for schedule(static)
  for (int64_t e = 0; e < n; ++e) {
    const int64_t full = where.first + (e / where.cols) * where.full_cols + e % where.cols;
    p[e] = std * tessera_philox_normal(seed, tensor_id, static_cast<uint64_t>(full));
  }
}

void fill(Tensor out, float value) {
  float* p = f32(out);
  std::fill(p, p + out.numel(), value);
}

}  // namespace tessera::ops::cpu
