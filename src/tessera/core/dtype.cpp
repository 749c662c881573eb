#include "tessera/core/dtype.h"


namespace tessera {

size_t dtype_size(DType t) {
  switch (t) {
    case DType::F32: case DType::I32: return 4;
    case DType::BF16: case DType::F16: case DType::U16: return 2;
    case DType::I64: return 8;
    case DType::U8: return 1;
  }
  return 0;
}

std::string_view dtype_name(DType t) {
  switch (t) {
    case DType::F32: return "f32";
    case DType::BF16: return "bf16";
    case DType::F16: return "f16";
    case DType::I32: return "i32";
    case DType::I64: return "i64";
    case DType::U16: return "u16";
    case DType::U8: return "u8";
  }
  return "?";
}

// GCC's _Float16 conversions round to nearest even and handle subnormals and infinities.
uint16_t f32_to_f16(float f) {
  _Float16 h = static_cast<_Float16>(f);
  uint16_t u;
  std::memcpy(&u, &h, 2);
  return u;
}
float f16_to_f32(uint16_t u) {
  _Float16 h;
  std::memcpy(&h, &u, 2);
  return static_cast<float>(h);
}

void widen_16bit(const uint16_t* bits, size_t n, DType dtype, float* out) {
  for (size_t i = 0; i < n; ++i) out[i] = dtype == DType::BF16 ? bf16_to_f32(bits[i]) : f16_to_f32(bits[i]);
}

void round_to_16bit(const float* values, size_t n, DType dtype, uint16_t* out) {
  for (size_t i = 0; i < n; ++i) out[i] = dtype == DType::BF16 ? f32_to_bf16(values[i]) : f32_to_f16(values[i]);
}

}  // namespace tessera
