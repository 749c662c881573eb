// Widening and rounding of storage blocks (storage.h). The half conversions use F16C /
// AVX-512 (VCVTPH2PS, VCVTPS2PH with round-to-nearest-even) where the build targets them,
// low_precision.h's scalar routines (the same bits) for tails and portable builds; the
// bfloat16 ones are integer loops GCC vectorises.
#include "tessera/ops/cpu/storage.h"

#include <immintrin.h>

#include <cstring>
#include <string>

#include "tessera/ops/cpu/low_precision.h"

namespace tessera::ops::cpu {
namespace {

constexpr int64_t kParallelMin = 1 << 15;  // below this many elements, one thread

bool is_float(DType t) { return t == DType::F32 || t == DType::BF16 || t == DType::F16; }

void widen_run(float* dst, const char* src, DType t, int64_t n) {
  if (t == DType::F32) {
    std::memcpy(dst, src, static_cast<size_t>(n) * sizeof(float));
  } else if (t == DType::BF16) {
    const uint16_t* s = reinterpret_cast<const uint16_t*>(src);
#pragma omp simd
    for (int64_t i = 0; i < n; ++i) dst[i] = bf16_to_f32(s[i]);
  } else {
    const uint16_t* s = reinterpret_cast<const uint16_t*>(src);
    int64_t i = 0;
#if defined(__F16C__)
    for (; i + 8 <= n; i += 8)
      _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i))));
#endif
    for (; i < n; ++i) dst[i] = fp16_to_f32(s[i]);
  }
}

void narrow_run(char* dst, DType t, const float* src, int64_t n) {
  if (t == DType::F32) {
    std::memmove(dst, src, static_cast<size_t>(n) * sizeof(float));
  } else if (t == DType::BF16) {
    uint16_t* d = reinterpret_cast<uint16_t*>(dst);
#pragma omp simd
    for (int64_t i = 0; i < n; ++i) d[i] = bf16_bits(src[i]);
  } else {
    uint16_t* d = reinterpret_cast<uint16_t*>(dst);
    int64_t i = 0;
#if defined(__F16C__)
    for (; i + 8 <= n; i += 8)
      _mm_storeu_si128(reinterpret_cast<__m128i*>(d + i),
                       _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
#endif
    for (; i < n; ++i) d[i] = fp16_bits(src[i]);
  }
}

// The address of element `off` of t.
char* element(const Tensor& t, int64_t off) {
  return cpu_memory(t) + static_cast<size_t>(off) * dtype_size(t.dtype);
}

}  // namespace

void check_float(const Tensor& t, const char* op, const char* arg) {
  if (t.empty() || is_float(t.dtype)) return;
  throw runtime_error(std::string(op) + ": " + arg + " has dtype " + std::string(dtype_name(t.dtype)) +
                          "; it must be f32, bf16 or f16",
                      "pass a floating tensor (ops.h lists each op's arguments)");
}

float* f32_arg(const Tensor& t, const char* op, const char* arg) {
  if (!t.empty() && t.dtype != DType::F32)
    throw runtime_error(std::string(op) + ": " + arg + " has dtype " + std::string(dtype_name(t.dtype)) +
                            "; it must be f32",
                        "ops.h keeps this argument in fp32 (statistics, optimizer state): allocate it as f32");
  return reinterpret_cast<float*>(cpu_memory(t));
}

void widen(float* dst, const Tensor& t, int64_t off, int64_t rows, int64_t cols, int64_t ld) {
  const size_t row_bytes = static_cast<size_t>(ld) * dtype_size(t.dtype);
  const char* src = element(t, off);
  for (int64_t r = 0; r < rows; ++r) widen_run(dst + r * cols, src + r * row_bytes, t.dtype, cols);
}

void narrow(const Tensor& t, int64_t off, int64_t ld, const float* src, int64_t src_ld, int64_t rows, int64_t cols) {
  const size_t row_bytes = static_cast<size_t>(ld) * dtype_size(t.dtype);
  char* dst = element(t, off);
  for (int64_t r = 0; r < rows; ++r) narrow_run(dst + r * row_bytes, t.dtype, src + r * src_ld, cols);
}

void widen_parallel(float* dst, const Tensor& t, int64_t off, int64_t rows, int64_t cols, int64_t ld) {
#pragma omp parallel for schedule(static) if (rows * cols >= kParallelMin)
  for (int64_t r = 0; r < rows; ++r) widen(dst + r * cols, t, off + r * ld, 1, cols, ld);
}

void narrow_parallel(const Tensor& t, int64_t off, int64_t ld, const float* src, int64_t src_ld, int64_t rows,
                     int64_t cols) {
#pragma omp parallel for schedule(static) if (rows * cols >= kParallelMin)
  for (int64_t r = 0; r < rows; ++r) narrow(t, off + r * ld, ld, src + r * src_ld, src_ld, 1, cols);
}

float* Stage::scratch(int64_t elements) {
  TESSERA_CHECK(used_ < kMaxBlocks, "Stage: more than kMaxBlocks 16-bit blocks in one work item");
  const auto slot = static_cast<Workspace>(static_cast<int>(Workspace::Stage0) + first_ + used_++);
  return static_cast<float*>(workspace(slot, static_cast<size_t>(elements) * sizeof(float)));
}

Block Stage::widened(const Tensor& t, int64_t off, int64_t rows, int64_t cols, int64_t ld) {
  float* p = scratch(rows * cols);
  widen(p, t, off, rows, cols, ld);
  return {p, cols};
}

}  // namespace tessera::ops::cpu
