// How the CPU kernels read and write floating tensors of any storage dtype (ops.h: F32,
// BF16 or F16, each tensor independently). The kernels compute in f32 on blocks of
// elements (a row, a chunk, one head of one sample):
// - an F32 tensor's block is its own memory: no copy, so the all-F32 path runs the same
//   loops on the same addresses, with the same bits and speed, as a kernel without this;
// - a 16-bit block is widened exactly into a scratch buffer of the calling thread, and a
//   written block is rounded ONCE (round-to-nearest-even: core/dtype.h f32_to_bf16,
//   low_precision.h fp16_bits) back into the tensor when the kernel is done with it. An
//   accumulating output (every backward's +=) is widened, added to in f32, rounded once.
// Scratch buffers are low_precision.h's thread-local workspaces, so in-process ranks
// (threads calling ops concurrently) and OpenMP workers each stage into their own.
#pragma once

#include <algorithm>
#include <cstdint>

#include "tessera/ops/cpu/cpu_tensor.h"
#include "tessera/ops/ops.h"

namespace tessera::ops::cpu {

// Throws a runtime Error naming the op, the argument and its dtype unless t is F32, BF16
// or F16 (an empty tensor passes).
void check_float(const Tensor& t, const char* op, const char* arg);
// The same for an argument the contract keeps F32 (statistics, optimizer state); returns
// its memory (nullptr when empty).
float* f32_arg(const Tensor& t, const char* op, const char* arg);

// dst[r * cols + c] = element off + r * ld + c of t, widened exactly (any float dtype).
void widen(float* dst, const Tensor& t, int64_t off, int64_t rows, int64_t cols, int64_t ld);
// Element off + r * ld + c of t = src[r * src_ld + c] rounded once to t's dtype.
void narrow(const Tensor& t, int64_t off, int64_t ld, const float* src, int64_t src_ld, int64_t rows, int64_t cols);

// A rows x cols block of f32 values: element (r, c) at p[r * ld + c].
struct Block {
  float* p;
  int64_t ld;
  float* row(int64_t r) const { return p + r * ld; }
};

// Stages the blocks of one work item. The block of a tensor is described by the offset of
// its first element and, for a strided block, rows x cols with the tensor's row stride ld
// (all in elements). Each 16-bit block takes the next of the Stage's scratch buffers;
// kMaxBlocks per Stage. Stages of the same thread must not be alive at once unless their
// Slots differ: a Caller stage holds small tensors (LayerNorm's weight) that the OpenMP
// threads of the following parallel region read while their Parallel stages work.
class Stage {
 public:
  enum Slots { Parallel, Caller };
  static constexpr int kMaxBlocks = 6;
  explicit Stage(Slots slots = Parallel) : first_(slots == Parallel ? 0 : kMaxBlocks) {}

  // For reading.
  const float* in(const Tensor& t, int64_t off, int64_t n) { return in(t, off, 1, n, n).p; }
  Block in(const Tensor& t, int64_t off, int64_t rows, int64_t cols, int64_t ld) {
    return t.dtype == DType::F32 ? own(t, off, ld) : widened(t, off, rows, cols, ld);
  }
  // For writing every element (contents undefined), then done().
  float* out(const Tensor& t, int64_t off, int64_t n) { return out(t, off, 1, n, n).p; }
  Block out(const Tensor& t, int64_t off, int64_t rows, int64_t cols, int64_t ld) {
    return t.dtype == DType::F32 ? own(t, off, ld) : Block{scratch(rows * cols), cols};
  }
  // For accumulating into (holds the current values), then done().
  float* inout(const Tensor& t, int64_t off, int64_t n) { return in(t, off, 1, n, n).p; }
  Block inout(const Tensor& t, int64_t off, int64_t rows, int64_t cols, int64_t ld) {
    return in(t, off, rows, cols, ld);
  }
  // For a gradient output written per ops.h's GradWrite (then done()): its current values
  // (Accumulate), or zeros without reading it (Assign), so that the kernel's += gives the
  // bits of accumulating into a zeroed tensor while this block is in cache.
  float* grad(const Tensor& t, int64_t off, int64_t n, GradWrite write) {
    if (write == GradWrite::Accumulate) return inout(t, off, n);
    float* p = out(t, off, n);
    std::fill(p, p + n, 0.0f);
    return p;
  }
  // Rounds a written block into t (nothing to do for F32: it was written in place).
  void done(const Tensor& t, int64_t off, int64_t n, float* p) { done(t, off, 1, n, n, {p, n}); }
  void done(const Tensor& t, int64_t off, int64_t rows, int64_t cols, int64_t ld, Block b) {
    if (t.dtype != DType::F32 || b.p != own(t, off, ld).p) narrow(t, off, ld, b.p, b.ld, rows, cols);
  }

 private:
  // The F32 path, inline: the tensor's memory.
  static Block own(const Tensor& t, int64_t off, int64_t ld) {
    return {reinterpret_cast<float*>(cpu_memory(t)) + off, ld};
  }
  Block widened(const Tensor& t, int64_t off, int64_t rows, int64_t cols, int64_t ld);
  float* scratch(int64_t elements);
  int first_;
  int used_ = 0;
};

// Elements [off, off+n) of t as f32: t's own memory when F32, else widened into buf[n].
inline const float* read(const Tensor& t, int64_t off, int64_t n, float* buf) {
  if (t.dtype == DType::F32) return reinterpret_cast<const float*>(cpu_memory(t)) + off;
  widen(buf, t, off, 1, n, n);
  return buf;
}

// The same, split over OpenMP threads by rows for large blocks (the linear layer's GEMM
// operands); for callers outside a parallel region.
void widen_parallel(float* dst, const Tensor& t, int64_t off, int64_t rows, int64_t cols, int64_t ld);
void narrow_parallel(const Tensor& t, int64_t off, int64_t ld, const float* src, int64_t src_ld, int64_t rows,
                     int64_t cols);

// Calls f(off, len) over [0, n) in chunks of kChunkElements, OpenMP-parallel (static
// schedule, so each thread walks one contiguous range as a plain parallel loop would).
constexpr int64_t kChunkElements = 1 << 14;
template <typename F>
void for_chunks(int64_t n, F f) {
  const int64_t chunks = (n + kChunkElements - 1) / kChunkElements;
#pragma omp parallel for schedule(static)
  for (int64_t c = 0; c < chunks; ++c) f(c * kChunkElements, std::min(kChunkElements, n - c * kChunkElements));
}

}  // namespace tessera::ops::cpu
