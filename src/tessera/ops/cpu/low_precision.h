// The 16-bit formats of the linear layers' math modes (ops.h MathMode), on the CPU
// backend: rounding f32 to bfloat16 and to IEEE half, scalar and over arrays, and the
// thread-local workspaces the low-precision GEMMs convert their operands into.
//
// Every rounding is round-to-nearest-even, like the hardware conversions and torch's
// .to(bfloat16) / .half():
// - bfloat16 (8 exponent bits, 7 stored mantissa bits): the f32 range, so nothing
//   overflows except values within half an ulp of FLT_MAX (they round to inf, as they
//   must); f32 subnormals round like any value; NaN stays NaN (quieted).
// - half (5 exponent bits, 10 mantissa bits): |x| >= 65520 (halfway between the largest
//   half, 65504, and 2^16; a tie that rounds to the even 2^16) becomes +-inf; below 2^-14
//   values become half subnormals (steps of 2^-24); below or at 2^-25 they become +-0;
//   NaN stays NaN (quieted, top payload bits kept, as VCVTPS2PH does).
// The scalar routines are portable C++ and define the results (inline, so loops over them
// vectorise; core/dtype.h's f32_to_f16 through GCC's _Float16 is an out-of-line call, and
// the tests check both agree); the array routines use F16C / AVX-512 conversion
// instructions where the build has them (tested to give the same bits).
#pragma once

#include <bit>
#include <cstddef>
#include <cstdint>

#include "tessera/core/dtype.h"

namespace tessera::ops::cpu {

// ---- bfloat16 -------------------------------------------------------------------------

// core/dtype.h's f32_to_bf16 / bf16_to_f32 (round-to-nearest-even, NaN quieted), inline.
inline uint16_t bf16_bits(float x) { return f32_to_bf16(x); }
// x rounded to the nearest bfloat16, as an f32 value.
inline float round_bf16(float x) { return bf16_to_f32(f32_to_bf16(x)); }

// ---- IEEE half ------------------------------------------------------------------------

inline uint16_t fp16_bits(float x) {
  const uint32_t u = std::bit_cast<uint32_t>(x);
  const uint32_t sign = (u >> 16) & 0x8000u, a = u & 0x7FFFFFFFu;
  if (a > 0x7F800000u) return static_cast<uint16_t>(sign | 0x7E00u | ((a >> 13) & 0x3FFu));  // NaN
  if (a >= 0x477FF000u) return static_cast<uint16_t>(sign | 0x7C00u);  // >= 65520 (and inf): inf
  if (a >= 0x38800000u) {  // normal half: rebias the exponent (127 -> 15), round 13 bits away
    const uint32_t r = a - 0x38000000u;
    return static_cast<uint16_t>(sign | ((r + 0xFFFu + ((r >> 13) & 1u)) >> 13));
  }
  if (a <= 0x33000000u) return static_cast<uint16_t>(sign);  // <= 2^-25 (a tie to even 0): zero
  // Subnormal half: the value in units of 2^-24 is m * 2^(e-126), m the 24-bit mantissa
  // with its implicit bit, e in [102, 112]; shift right by 126 - e in [14, 24], rounding.
  const uint32_t e = a >> 23, m = (a & 0x7FFFFFu) | 0x800000u, shift = 126 - e;
  uint32_t q = m >> shift;
  const uint32_t rem = m & ((1u << shift) - 1), halfway = 1u << (shift - 1);
  if (rem > halfway || (rem == halfway && (q & 1u))) ++q;  // may carry into 0x400: the least normal
  return static_cast<uint16_t>(sign | q);
}
inline float fp16_to_f32(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16, e = (h >> 10) & 0x1Fu, m = h & 0x3FFu;
  if (e == 0x1F) return std::bit_cast<float>(sign | 0x7F800000u | (m << 13) | (m ? 0x400000u : 0u));  // inf, quiet NaN
  if (e == 0) {  // zero, subnormal: m * 2^-24, exact in f32
    const float v = static_cast<float>(m) * 0x1p-24f;
    return sign ? -v : v;
  }
  return std::bit_cast<float>(sign | ((e + 112) << 23) | (m << 13));
}
// x rounded to the nearest half, as an f32 value.
inline float round_fp16(float x) { return fp16_to_f32(fp16_bits(x)); }

// ---- arrays ---------------------------------------------------------------------------
// Each converts the rows x cols block of src with leading dimension ld (ld >= cols) into
// the contiguous block dst[rows * cols]. OpenMP-parallel for large blocks, vectorised.

// One block conversion. ld == 0 repeats src's first row in every row (a broadcast).
struct Conversion {
  enum Kind : uint8_t { Bf16Bits, Bf16Round, Fp16Round, Copy };
  Kind kind;
  void* dst;  // contiguous rows x cols: uint16_t for Bf16Bits, float otherwise; may be src if contiguous
  const float* src;
  int64_t rows, cols, ld;
};
// Runs the conversions (at most 8) in ONE OpenMP parallel region: on a shared machine every
// region's closing barrier can wait a scheduler time slice for a descheduled thread.
void convert_all(const Conversion* jobs, int count);

// bfloat16 bits (oneDNN's bf16 memory).
void convert_bf16(uint16_t* dst, const float* src, int64_t rows, int64_t cols, int64_t ld);
// Rounded to bfloat16, kept as f32 values.
void round_bf16(float* dst, const float* src, int64_t rows, int64_t cols, int64_t ld);
// Rounded to half, kept as f32 values. dst may be src when ld == cols (in place).
void round_fp16(float* dst, const float* src, int64_t rows, int64_t cols, int64_t ld);
// The f32 values of bfloat16 bits (exact).
void expand_bf16(float* dst, const uint16_t* src, int64_t rows, int64_t cols, int64_t ld);
// dst[i] += round_fp16(src[i]): a contribution stored as half, accumulated in f32. src is
// overwritten with its rounded values.
void add_rounded_fp16(float* dst, float* src, int64_t n);

// ---- workspaces -----------------------------------------------------------------------
// Conversion buffers of the low-precision GEMMs: one growing buffer per slot and per
// CALLING thread (thread_local; OpenMP workers only write into the caller's buffers).
// Thread-local rather than one buffer of the backend because the in-process communicator
// runs tensor/pipeline-parallel ranks as threads of one process that call the ops
// concurrently: a shared buffer would need a lock around every GEMM. A buffer grows
// (geometrically) to the largest request and is kept until the thread exits, so a
// training loop allocates only during its first step. The low-precision linear tiles its
// weight-sized operands (see set_lowp_tile_elements), which bounds each buffer to a few
// tens of MB per calling thread even for a 50k-row LM head.
// Stage0.. are the blocks of storage.h's Stage (2 * Stage::kMaxBlocks slots).
enum class Workspace { Input, Weight, Dout, Out, Small, ExpandA, ExpandB, Stage0, kCount = Stage0 + 12 };
// A 64-byte aligned buffer of at least `bytes` for this thread; contents undefined.
void* workspace(Workspace slot, size_t bytes);
// How many times this thread's workspaces were (re)allocated: constant in steady state.
uint64_t workspace_allocations();

// The low-precision linear converts its weight-row dimension (OC) in tiles of at most
// this many elements of the largest converted block (default 4M: 16 MB as f32), at least
// 64 rows per tile. Returns the previous value. For tests (forcing several tiles on small
// shapes) and experiments; not thread-safe against concurrent linear calls.
int64_t set_lowp_tile_elements(int64_t elements);
int64_t lowp_tile_elements();

}  // namespace tessera::ops::cpu
