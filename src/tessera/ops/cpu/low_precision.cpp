// Widening bfloat16 arrays and the thread-local conversion workspaces (low_precision.h).
#include "tessera/ops/cpu/low_precision.h"

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

void expand_bf16(float* dst, const uint16_t* src, int64_t rows, int64_t cols, int64_t ld) {
  for_blocks(rows, cols, ld, [&](int64_t d, int64_t s, int64_t len) {
#pragma omp simd
    for (int64_t i = 0; i < len; ++i) dst[d + i] = bf16_to_f32(src[s + i]);
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
