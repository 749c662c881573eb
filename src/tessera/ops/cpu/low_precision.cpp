// Array conversions to the 16-bit formats and the thread-local conversion workspaces
// (low_precision.h). The half conversions use VCVTPS2PH / VCVTPH2PS (F16C, AVX-512F)
// with round-to-nearest-even when the build targets them, the scalar routine for the
// tails and in portable builds; the bfloat16 ones are plain integer loops GCC vectorises.
#include "tessera/ops/cpu/low_precision.h"

#include <immintrin.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <new>

#include "tessera/core/error.h"

namespace tessera::ops::cpu {
namespace {

constexpr int64_t kChunk = 1 << 14;       // elements per OpenMP work item of a flat array
constexpr int64_t kParallelMin = 1 << 15;  // below this many elements, one thread

// Calls f(dst_offset, src_offset, len) over the rows x cols block (leading dimension ld),
// in parallel: a contiguous block in fixed chunks, a strided one row by row.
template <typename F>
void for_blocks(int64_t rows, int64_t cols, int64_t ld, F f) {
  TESSERA_CHECK(rows >= 0 && cols >= 0 && ld >= cols, "conversion: bad block");
  const int64_t n = rows * cols;
  if (n == 0) return;
  if (ld == cols || rows == 1) {
    const int64_t chunks = (n + kChunk - 1) / kChunk;
#pragma omp parallel for schedule(static) if (n >= kParallelMin)
    for (int64_t c = 0; c < chunks; ++c) f(c * kChunk, c * kChunk, std::min(kChunk, n - c * kChunk));
  } else {
#pragma omp parallel for schedule(static) if (n >= kParallelMin)
    for (int64_t r = 0; r < rows; ++r) f(r * cols, r * ld, cols);
  }
}

void bf16_bits_run(uint16_t* dst, const float* src, int64_t len) {
#pragma omp simd
  for (int64_t i = 0; i < len; ++i) dst[i] = bf16_bits(src[i]);
}
void bf16_round_run(float* dst, const float* src, int64_t len) {
#pragma omp simd
  for (int64_t i = 0; i < len; ++i) dst[i] = round_bf16(src[i]);
}

// Round-to-nearest-even through half; dst may equal src.
void fp16_round_run(float* dst, const float* src, int64_t len) {
  int64_t i = 0;
#if defined(__AVX512F__)
  for (; i + 16 <= len; i += 16) {
    const __m256i h = _mm512_cvtps_ph(_mm512_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    _mm512_storeu_ps(dst + i, _mm512_cvtph_ps(h));
  }
#endif
#if defined(__F16C__)
  for (; i + 8 <= len; i += 8) {
    const __m128i h = _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(h));
  }
#endif
  for (; i < len; ++i) dst[i] = round_fp16(src[i]);
}

// Slots of this thread's workspaces.
struct Slab {
  std::byte* data = nullptr;
  size_t capacity = 0;
  Slab() = default;
  Slab(const Slab&) = delete;
  Slab& operator=(const Slab&) = delete;
  ~Slab() { ::operator delete(data, std::align_val_t(64)); }
};
thread_local std::array<Slab, static_cast<size_t>(Workspace::kCount)> t_slabs;
thread_local uint64_t t_allocations = 0;

std::atomic<int64_t> g_tile_elements{int64_t{1} << 22};

}  // namespace

void convert_all(const Conversion* jobs, int count) {
  // Work items: a contiguous block in flat chunks of kChunk elements, any other (strided,
  // broadcast) in groups of whole rows of about kChunk elements.
  constexpr int kMaxJobs = 8;
  TESSERA_CHECK(count >= 0 && count <= kMaxJobs, "convert_all: too many conversions");
  int64_t first_item[kMaxJobs + 1] = {0}, rows_per_item[kMaxJobs] = {0}, total = 0;
  for (int j = 0; j < count; ++j) {
    const Conversion& c = jobs[j];
    TESSERA_CHECK(c.rows >= 0 && c.cols >= 0 && (c.ld >= c.cols || c.ld == 0), "conversion: bad block");
    TESSERA_CHECK(c.dst != c.src || c.ld == c.cols || c.rows <= 1, "conversion: in place needs a contiguous block");
    const int64_t n = c.rows * c.cols;
    const bool flat = c.ld == c.cols;
    rows_per_item[j] = flat ? 0 : std::max<int64_t>(1, kChunk / std::max<int64_t>(c.cols, 1));
    const int64_t items = n == 0 ? 0 : flat ? (n + kChunk - 1) / kChunk : (c.rows + rows_per_item[j] - 1) / rows_per_item[j];
    first_item[j + 1] = first_item[j] + items;
    total += n;
  }
  const int64_t items = first_item[count];
  auto run = [](const Conversion& c, int64_t d, int64_t s, int64_t len) {
    switch (c.kind) {
      case Conversion::Bf16Bits: bf16_bits_run(static_cast<uint16_t*>(c.dst) + d, c.src + s, len); break;
      case Conversion::Bf16Round: bf16_round_run(static_cast<float*>(c.dst) + d, c.src + s, len); break;
      case Conversion::Fp16Round: fp16_round_run(static_cast<float*>(c.dst) + d, c.src + s, len); break;
      case Conversion::Copy: std::copy(c.src + s, c.src + s + len, static_cast<float*>(c.dst) + d); break;
    }
  };
#pragma omp parallel for schedule(static) if (total >= kParallelMin)
  for (int64_t item = 0; item < items; ++item) {
    int j = 0;
    while (item >= first_item[j + 1]) ++j;
    const Conversion& c = jobs[j];
    const int64_t k = item - first_item[j];
    if (rows_per_item[j] == 0) {
      const int64_t off = k * kChunk;
      run(c, off, off, std::min(kChunk, c.rows * c.cols - off));
    } else {
      const int64_t r1 = std::min(c.rows, (k + 1) * rows_per_item[j]);
      for (int64_t r = k * rows_per_item[j]; r < r1; ++r) run(c, r * c.cols, r * c.ld, c.cols);
    }
  }
}

void convert_bf16(uint16_t* dst, const float* src, int64_t rows, int64_t cols, int64_t ld) {
  const Conversion c{Conversion::Bf16Bits, dst, src, rows, cols, ld};
  convert_all(&c, 1);
}

void round_bf16(float* dst, const float* src, int64_t rows, int64_t cols, int64_t ld) {
  const Conversion c{Conversion::Bf16Round, dst, src, rows, cols, ld};
  convert_all(&c, 1);
}

void round_fp16(float* dst, const float* src, int64_t rows, int64_t cols, int64_t ld) {
  const Conversion c{Conversion::Fp16Round, dst, src, rows, cols, ld};
  convert_all(&c, 1);
}

void expand_bf16(float* dst, const uint16_t* src, int64_t rows, int64_t cols, int64_t ld) {
  for_blocks(rows, cols, ld, [&](int64_t d, int64_t s, int64_t len) {
#pragma omp simd
    for (int64_t i = 0; i < len; ++i) dst[d + i] = bf16_to_f32(src[s + i]);
  });
}

void add_rounded_fp16(float* dst, float* src, int64_t n) {
  for_blocks(1, n, n, [&](int64_t d, int64_t s, int64_t len) {
    fp16_round_run(src + s, src + s, len);
#pragma omp simd
    for (int64_t i = 0; i < len; ++i) dst[d + i] += src[s + i];
  });
}

void* workspace(Workspace slot, size_t bytes) {
  Slab& slab = t_slabs[static_cast<size_t>(slot)];
  if (bytes > slab.capacity) {
    const size_t capacity = std::max(bytes, slab.capacity + slab.capacity / 2);
    ::operator delete(slab.data, std::align_val_t(64));
    slab.data = nullptr;
    slab.capacity = 0;
    slab.data = static_cast<std::byte*>(::operator new(capacity, std::align_val_t(64)));
    slab.capacity = capacity;
    ++t_allocations;
  }
  return slab.data;
}

uint64_t workspace_allocations() { return t_allocations; }

int64_t set_lowp_tile_elements(int64_t elements) {
  TESSERA_CHECK(elements > 0, "set_lowp_tile_elements: must be positive");
  return g_tile_elements.exchange(elements);
}
int64_t lowp_tile_elements() { return g_tile_elements.load(); }

}  // namespace tessera::ops::cpu
