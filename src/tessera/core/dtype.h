// Element types of tensors and files. bf16/f16 are stored as raw 16-bit patterns.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string_view>

namespace tessera {

enum class DType : uint8_t { F32, BF16, F16, I32, I64, U16, U8 };

size_t dtype_size(DType t);
std::string_view dtype_name(DType t);

// bf16 <-> f32 with round-to-nearest-even (NaN stays NaN).
inline uint16_t f32_to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}
inline float bf16_to_f32(uint16_t h) {
  uint32_t u = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
uint16_t f32_to_f16(float f);
float f16_to_f32(uint16_t h);

// n 16-bit values of `dtype` (BF16 or F16) widened to f32 (exact), and n f32 values rounded
// to `dtype` (round-to-nearest-even): the host side of 16-bit storage.
void widen_16bit(const uint16_t* bits, size_t n, DType dtype, float* out);
void round_to_16bit(const float* values, size_t n, DType dtype, uint16_t* out);

}  // namespace tessera
