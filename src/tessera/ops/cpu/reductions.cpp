// Reductions for the optimizer: squared norms (for global-norm clipping) and scaling, on
// tensors of any float dtype (staged in chunks, storage.h); the sums stay in double.
#include <algorithm>
#include <cmath>
#include <vector>

#include "tessera/ops/cpu/cpu_ops.h"
#include "tessera/ops/cpu/storage.h"

namespace tessera::ops::cpu {
namespace {

// Fixed chunks, each summed in double, then the chunk sums added in order: the result
// depends only on the data, never on the thread count or schedule.
constexpr int64_t kChunk = kMultiTensorChunk;
static_assert(kChunk == 1 << 16, "sum_squares' chunks are the multi-tensor chunks");

// The sums of squares of up to kWays chunks: per chunk 32 double accumulators (four AVX-512
// registers), four independent FMA chains, so the loop runs at memory speed instead of
// waiting on one chain's latency; element i of a full 32-block to accumulator i % 32, the
// tail to accumulator 0; then the accumulators in order. The chunks are read side by side:
// one sequential stream per core leaves most of the memory bandwidth unused (one stream
// per chunk: 1.6x faster over a GPT-2 124M gradient); each chunk's arithmetic is the same
// as alone.
// The side-by-side loop prefetches each chunk kAhead elements (2 KiB) ahead: the hardware
// prefetchers alone leave the four streams short of the bandwidth (-4 % CPU time over
// GPT-2 124M's gradient; the arithmetic, and so the bits, unchanged).
constexpr int kLanes = 32, kWays = 4;
constexpr int64_t kAhead = 512;

void sums_of_squares(const float* const* x, const int64_t* len, int ways, double* out) {
  double acc[kWays][kLanes] = {};
  int64_t common = len[0];
  for (int w = 0; w < ways; ++w) common = std::min(common, len[w] / kLanes * kLanes);
  if (ways < kWays) common = 0;  // the interleaved loop below is unrolled for kWays
  for (int64_t i = 0; i < common; i += kLanes)
    for (int w = 0; w < kWays; ++w) {
      if (i + kAhead < common) {
        __builtin_prefetch(x[w] + i + kAhead, 0, 3);
        __builtin_prefetch(x[w] + i + kAhead + 16, 0, 3);
      }
#pragma omp simd
      for (int64_t j = 0; j < kLanes; ++j) acc[w][j] += static_cast<double>(x[w][i + j]) * x[w][i + j];
    }
  for (int w = 0; w < ways; ++w) {
    int64_t i = common;
    for (; i + kLanes <= len[w]; i += kLanes) {
#pragma omp simd
      for (int64_t j = 0; j < kLanes; ++j) acc[w][j] += static_cast<double>(x[w][i + j]) * x[w][i + j];
    }
    for (; i < len[w]; ++i) acc[w][0] += static_cast<double>(x[w][i]) * x[w][i];
    double s = 0.0;
    for (int64_t j = 0; j < kLanes; ++j) s += acc[w][j];
    out[w] = s;
  }
}

}  // namespace

void sum_squares(Tensor sums, int64_t slot, Tensor t) {
  TESSERA_CHECK(slot >= 0 && slot < sums.numel(),
                "sum_squares: slot " + std::to_string(slot) + " outside sums " + shape_str(sums.shape));
  check_float(t, "sum_squares", "t");
  double* out = f64(sums);
  const int64_t n = t.numel();
  const int64_t chunks = (n + kChunk - 1) / kChunk;
  std::vector<double> partial(static_cast<size_t>(chunks));
#pragma omp parallel for schedule(static)
  for (int64_t c0 = 0; c0 < chunks; c0 += kWays) {
    const int ways = static_cast<int>(std::min<int64_t>(kWays, chunks - c0));
    Stage stage;
    const float* x[kWays];
    int64_t len[kWays];
    for (int w = 0; w < ways; ++w) {
      const int64_t off = (c0 + w) * kChunk;
      len[w] = std::min(kChunk, n - off);
      x[w] = stage.in(t, off, len[w]);
    }
    sums_of_squares(x, len, ways, partial.data() + c0);
  }
  double total = 0.0;
  for (double s : partial) total += s;
  out[slot] += total;
}

Shape multi_tensor_sum_squares_workspace(const Device&, int64_t chunks) { return {chunks}; }

void multi_tensor_sum_squares(Tensor sums, Tensor workspace, Tensor grad, Tensor chunks) {
  f32_arg(grad, "multi_tensor_sum_squares", "grad");
  chunks.check_dtype(DType::I64);
  TESSERA_CHECK(chunks.ndim() == 2 && chunks.dim(1) == kChunkColumns,
                "multi_tensor_sum_squares: chunks " + shape_str(chunks.shape) + ", expected [C, kChunkColumns]");
  const int64_t rows = chunks.dim(0);
  TESSERA_CHECK(workspace.numel() >= rows, "multi_tensor_sum_squares: workspace " + shape_str(workspace.shape) +
                                               " for " + std::to_string(rows) + " chunks (see its workspace query)");
  const int64_t* table = reinterpret_cast<const int64_t*>(cpu_memory(chunks));
  double* out = f64(sums);
  double* partial = f64(workspace);
  const float* g = f32(grad);
  for (int64_t c = 0; c < rows; ++c) {
    const int64_t* row = table + c * kChunkColumns;
    TESSERA_CHECK(row[kChunkGrad] >= 0 && row[kChunkNumel] >= 0 && row[kChunkGrad] + row[kChunkNumel] <= grad.numel() &&
                      row[kChunkSlot] >= 0 && row[kChunkSlot] < sums.numel() && c + row[kChunkSegment] <= rows,
                  "multi_tensor_sum_squares: chunk " + std::to_string(c) + " lies outside grad " +
                      shape_str(grad.shape) + " or sums " + shape_str(sums.shape));
  }
#pragma omp parallel for schedule(static)
  for (int64_t c0 = 0; c0 < rows; c0 += kWays) {
    const int ways = static_cast<int>(std::min<int64_t>(kWays, rows - c0));
    const float* x[kWays];
    int64_t len[kWays];
    for (int w = 0; w < ways; ++w) {
      const int64_t* row = table + (c0 + w) * kChunkColumns;
      x[w] = g + row[kChunkGrad];
      len[w] = row[kChunkNumel];
    }
    sums_of_squares(x, len, ways, partial + c0);
  }
  // Each segment's chunks in order, as sum_squares adds a tensor's.
  for (int64_t c = 0; c < rows; ++c) {
    const int64_t* row = table + c * kChunkColumns;
    if (row[kChunkSegment] == 0) continue;
    double total = 0.0;
    for (int64_t k = 0; k < row[kChunkSegment]; ++k) total += partial[c + k];
    out[row[kChunkSlot]] += total;
  }
}

void grad_norm_finish(Tensor result, Tensor scalars, Tensor sums, float clip_grad) {
  TESSERA_CHECK(result.numel() == 2, "grad_norm_finish: result " + shape_str(result.shape) + ", expected [2]");
  TESSERA_CHECK(scalars.numel() == kStepScalars, "grad_norm_finish: scalars " + shape_str(scalars.shape));
  const double* slots = f64(sums);
  double total = 0.0;
  for (int64_t i = 0; i < sums.numel(); ++i) total += slots[i];
  float* s = f32(scalars);
  const double loss_scale = s[kLossScale];
  const double norm = std::sqrt(total) / loss_scale;
  double coeff = 1.0;
  if (clip_grad > 0.0f) {
    const double c = clip_grad / (norm + 1e-6);
    coeff = c < 1.0 ? c : 1.0;
  }
  s[kGradScale] = static_cast<float>(coeff / loss_scale);
  double* out = f64(result);
  out[0] = norm;
  out[1] = std::isfinite(total) ? 0.0 : 1.0;
}

void scale_inplace(Tensor t, float scale) {
  check_float(t, "scale_inplace", "t");
  for_chunks(t.numel(), [&](int64_t off, int64_t len) {
    Stage s;
    float* x = s.inout(t, off, len);
#pragma omp simd
    for (int64_t i = 0; i < len; ++i) x[i] *= scale;
    s.done(t, off, len, x);
  });
}

}  // namespace tessera::ops::cpu
