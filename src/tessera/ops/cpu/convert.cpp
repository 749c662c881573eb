// ops.h convert: out = inp in out's dtype. Each element is widened exactly to f32, then
// rounded once to out's dtype (low_precision.h: bfloat16 and IEEE half, round-to-nearest-
// even), so F16 -> BF16 rounds once, not twice.
#include "tessera/ops/cpu/cpu_ops.h"
#include "tessera/ops/cpu/low_precision.h"
#include "tessera/ops/cpu/storage.h"

namespace tessera::ops::cpu {
namespace {

// Calls f with a loader of inp's elements as f32.
template <typename F>
void with_loader(const Tensor& inp, F&& f) {
  const char* p = cpu_memory(inp);
  switch (inp.dtype) {
    case DType::F32: return f([x = reinterpret_cast<const float*>(p)](int64_t i) { return x[i]; });
    case DType::BF16: return f([x = reinterpret_cast<const uint16_t*>(p)](int64_t i) { return bf16_to_f32(x[i]); });
    default: return f([x = reinterpret_cast<const uint16_t*>(p)](int64_t i) { return fp16_to_f32(x[i]); });
  }
}

template <typename Load>
void store_all(const Tensor& out, Load load) {
  const int64_t n = out.numel();
  char* p = cpu_memory(out);
  if (out.dtype == DType::F32) {
    float* y = reinterpret_cast<float*>(p);
#pragma omp parallel for simd schedule(static)
    for (int64_t i = 0; i < n; ++i) y[i] = load(i);
  } else if (out.dtype == DType::BF16) {
    uint16_t* y = reinterpret_cast<uint16_t*>(p);
#pragma omp parallel for simd schedule(static)
    for (int64_t i = 0; i < n; ++i) y[i] = bf16_bits(load(i));
  } else {
    uint16_t* y = reinterpret_cast<uint16_t*>(p);
#pragma omp parallel for simd schedule(static)
    for (int64_t i = 0; i < n; ++i) y[i] = fp16_bits(load(i));
  }
}

}  // namespace

void convert(Tensor out, Tensor inp) {
  check_float(out, "convert", "out");
  check_float(inp, "convert", "inp");
  TESSERA_CHECK(out.numel() == inp.numel(),
                "convert: out " + shape_str(out.shape) + " vs inp " + shape_str(inp.shape) +
                    " (element counts differ)");
  if (out.same_memory(inp) && out.dtype == inp.dtype) return;
  TESSERA_CHECK(!out.same_memory(inp), "convert: out aliases inp with another dtype");
  with_loader(inp, [&](auto load) { store_all(out, load); });
}

}  // namespace tessera::ops::cpu
