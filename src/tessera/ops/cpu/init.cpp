// Parameter initialisation on the device (ops.h init_normal, fill): Megatron's normal init
// drawn from core/philox.h, the source every backend compiles, so each backend and each
// layout holds the same weights. Any float dtype: drawn in f32, rounded once (storage.h).
#include <algorithm>

#include "tessera/core/philox.h"
#include "tessera/ops/cpu/cpu_ops.h"
#include "tessera/ops/cpu/storage.h"

namespace tessera::ops::cpu {

void init_normal(Tensor out, float std, uint32_t seed, uint32_t tensor_id, ShardIndex where) {
  TESSERA_CHECK(where.cols > 0, "init_normal: ShardIndex.cols must be positive");
  check_float(out, "init_normal", "out");
  for_chunks(out.numel(), [&](int64_t off, int64_t len) {
    Stage s;
    float* p = s.out(out, off, len);
    for (int64_t i = 0; i < len; ++i) {
      const int64_t e = off + i, full = where.first + (e / where.cols) * where.full_cols + e % where.cols;
      p[i] = std * tessera_philox_normal(seed, tensor_id, static_cast<uint64_t>(full));
    }
    s.done(out, off, len, p);
  });
}

void fill(Tensor out, float value) {
  check_float(out, "fill", "out");
  for_chunks(out.numel(), [&](int64_t off, int64_t len) {
    Stage s;
    float* p = s.out(out, off, len);
    std::fill(p, p + len, value);
    s.done(out, off, len, p);
  });
}

}  // namespace tessera::ops::cpu
