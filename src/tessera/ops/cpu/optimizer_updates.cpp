// Element-wise optimizer updates (param and state f32, the gradient any float dtype,
// staged in chunks: storage.h), written op for op like PyTorch's single-tensor
// implementations (torch/optim/adamw.py, sgd.py) so that fp32 results track torch's:
// host-side scalars are computed in double (as Python does) and rounded to float once.
// Both are memory-bound (AdamW streams 7 floats per parameter), so the loops are plain
// vectorised streams split across threads. The multi-tensor ops run the same loops over
// the chunks of a slab's table (ops.h), with the scalars read from device memory.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

#if defined(__AVX512F__)
#include <immintrin.h>
#endif

#include "tessera/ops/cpu/cpu_ops.h"
#include "tessera/ops/cpu/low_precision.h"
#include "tessera/ops/cpu/storage.h"

namespace tessera::ops::cpu {
namespace {

// The float scalars of one AdamW step (adamw_update's host arithmetic).
struct AdamScalars {
  float decay, w1, w1c, beta2, w2, step_size, bc2_sqrt, eps, grad_scale;
  bool lerp_low;
};

AdamScalars adam_constants(float beta1, float beta2, float eps) {
  AdamScalars a{};
  // torch: exp_avg.lerp_(grad, 1 - beta1); ATen's lerp is a + w (b - a) for w < 0.5,
  // b - (b - a)(1 - w) otherwise.
  a.w1 = static_cast<float>(1.0 - static_cast<double>(beta1));
  a.lerp_low = a.w1 < 0.5f;
  a.w1c = 1.0f - a.w1;
  // torch: exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
  a.beta2 = beta2;
  a.w2 = static_cast<float>(1.0 - static_cast<double>(beta2));
  a.eps = eps;
  return a;
}

// AdamW on len elements: p, mm, vv updated in place from the gradient g.
inline void adamw_elements(float* p, float* mm, float* vv, const float* g, int64_t len, const AdamScalars& a) {
#pragma omp simd
  for (int64_t i = 0; i < len; ++i) {
    const float gi = g[i] * a.grad_scale;  // exact when grad_scale == 1
    float pi = p[i] * a.decay;
    const float mi = a.lerp_low ? mm[i] + a.w1 * (gi - mm[i]) : gi - (gi - mm[i]) * a.w1c;
    const float vi = vv[i] * a.beta2 + a.w2 * (gi * gi);
    const float denom = std::sqrt(vi) / a.bc2_sqrt + a.eps;
    pi = pi - a.step_size * (mi / denom);
    p[i] = pi;
    mm[i] = mi;
    vv[i] = vi;
  }
}

// SGD on len elements (buf null: momentum 0, no buffer).
// torch: d_p = g + wd p; without momentum p -= lr d_p (torch keeps no buffer); with it
// buf = clone(d_p) on the first step, else buf = momentum buf + d_p (dampening 0), and
// p -= lr buf.
inline void sgd_elements(float* p, float* buf, const float* g, int64_t len, float lr, float momentum,
                         float weight_decay, bool first, float grad_scale) {
  if (!buf) {
#pragma omp simd
    for (int64_t i = 0; i < len; ++i) p[i] = p[i] - lr * (g[i] * grad_scale + weight_decay * p[i]);
    return;
  }
#pragma omp simd
  for (int64_t i = 0; i < len; ++i) {
    const float gi = g[i] * grad_scale;
    const float d = weight_decay != 0.0f ? gi + weight_decay * p[i] : gi;
    const float b = first ? d : buf[i] * momentum + d;
    buf[i] = b;
    p[i] = p[i] - lr * b;
  }
}

// The checks every multi-tensor update makes; returns the table's rows.
int64_t check_slab_update(const char* op, const Tensor& main, const Tensor& param, const Tensor& grad,
                          const Tensor& chunks, const Tensor& scalars) {
  f32_arg(main, op, "main");
  f32_arg(grad, op, "grad");
  f32_arg(scalars, op, "scalars");
  TESSERA_CHECK(param.empty() || param.dtype == DType::BF16 || param.dtype == DType::F16,
                std::string(op) + ": param is the 16-bit copy (bf16 or f16) or absent, not " +
                    std::string(dtype_name(param.dtype)));
  TESSERA_CHECK(scalars.numel() == kStepScalars, std::string(op) + ": scalars " + shape_str(scalars.shape));
  chunks.check_dtype(DType::I64);
  TESSERA_CHECK(chunks.ndim() == 2 && chunks.dim(1) == kChunkColumns,
                std::string(op) + ": chunks " + shape_str(chunks.shape) + ", expected [C, kChunkColumns]");
  return chunks.dim(0);
}

// Every element a chunk row names lies inside its tensor (an empty tensor: not used).
void check_row(const char* op, const int64_t* row, const Tensor& main, const Tensor& param, const Tensor& grad,
               const Tensor& state) {
  const int64_t n = row[kChunkNumel];
  auto inside = [&](int64_t at, const Tensor& t, const char* name) {
    TESSERA_CHECK(t.empty() || (at >= 0 && n >= 0 && at + n <= t.numel()),
                  std::string(op) + ": a chunk of " + std::to_string(n) + " at " + std::to_string(at) +
                      " lies outside " + name + " " + shape_str(t.shape));
  };
  inside(row[kChunkMain], main, "main");
  inside(row[kChunkParam], param, "param");
  inside(row[kChunkGrad], grad, "grad");
  inside(row[kChunkState], state, "state");
}

// The multi-tensor updates call their element loop a line of the bf16 copy at a time.
constexpr int64_t kLine = 32;  // 16-bit values per 64-byte line
// How far ahead of its line an update prefetches its streams: 2 KiB of each f32 stream.
// The hardware prefetchers alone leave AdamW's four streams short of the bandwidth (-9 %
// CPU time with this, on the Sapphire Rapids VM, over GPT-2 124M's slabs).
constexpr int64_t kAhead = 512;

// Prefetches into L1 the line at element `at` of each stream, if inside the chunk's n.
template <typename... Streams>
inline void prefetch_line(int64_t at, int64_t n, const Streams*... streams) {
  if (at + kLine > n) return;
  for (int64_t k = 0; k < kLine; k += 64 / static_cast<int64_t>(sizeof(float)))
    (__builtin_prefetch(streams + at + k, 0, 3), ...);
}

// Rounds kLine values into one 64-byte line of a bf16 copy (convert's bits), with a
// streaming store where the build has AVX-512.
inline void store_bf16_line(uint16_t* dst, const float* p) {
  alignas(64) uint16_t line[kLine];
#pragma omp simd
  for (int64_t j = 0; j < kLine; ++j) line[j] = bf16_bits(p[j]);
#if defined(__AVX512F__)
  _mm512_stream_si512(reinterpret_cast<__m512i*>(dst), _mm512_load_si512(line));
#else
  std::memcpy(dst, line, sizeof(line));
#endif
}

// Runs update(off, len) over the n elements of a chunk, whose main values start at p, a
// line at a time, and rounds the updated values into the 16-bit copy (convert's bits). A
// bf16 copy is written line by line, right after its kLine values are updated (still in
// L1), with streaming stores: the copy is read again only by the next step's forward, long
// after this pass has evicted it, so writing around the caches saves the read of every
// destination line that an ordinary store makes first. Rounding line by line rather than in
// a second pass over the chunk saves that pass's re-read of the main values and keeps its
// burst of streamed lines out of the loop (bf16 AdamW: -8 % CPU time).
template <typename Update>
void update_chunk(const Tensor& param, const int64_t* row, const float* p, Update update) {
  const int64_t n = row[kChunkNumel];
  uint16_t* dst = nullptr;
  int64_t i = 0;
  if (!param.empty() && param.dtype == DType::BF16) {
    dst = reinterpret_cast<uint16_t*>(cpu_memory(param)) + row[kChunkParam];
    i = std::min<int64_t>(n, (64 - reinterpret_cast<uintptr_t>(dst) % 64) % 64 / 2);  // to dst's first line
    update(0, i);
    for (int64_t j = 0; j < i; ++j) dst[j] = bf16_bits(p[j]);
  }
  for (; i + kLine <= n; i += kLine) {
    update(i, kLine);
    if (dst) store_bf16_line(dst + i, p + i);
  }
  update(i, n - i);
  if (dst) {
#if defined(__AVX512F__)
    _mm_sfence();  // the streamed lines are visible before this thread reaches the loop's barrier
#endif
    for (; i < n; ++i) dst[i] = bf16_bits(p[i]);
  } else if (!param.empty()) {
    narrow(param, row[kChunkParam], n, p, n, 1, n);
  }
}

}  // namespace

void adamw_update(Tensor param, Tensor grad, Tensor m, Tensor v, float lr, float beta1, float beta2,
                  float eps, float weight_decay, int64_t step, float grad_scale) {
  const int64_t n = param.numel();
  TESSERA_CHECK(grad.numel() == n && m.numel() == n && v.numel() == n,
                "adamw: param " + shape_str(param.shape) + ", grad " + shape_str(grad.shape) + ", m " +
                    shape_str(m.shape) + ", v " + shape_str(v.shape));
  TESSERA_CHECK(step >= 1, "adamw: step is 1-based");
  float s[kGradScale];
  step_scalars(s, lr, weight_decay, 1.0, beta1, beta2, step);
  AdamScalars a = adam_constants(beta1, beta2, eps);
  a.decay = s[kAdamDecay];
  a.step_size = s[kAdamStepSize];
  a.bc2_sqrt = s[kAdamBc2Sqrt];
  a.grad_scale = grad_scale;
  float* param0 = f32_arg(param, "adamw_update", "param");
  float* m0 = f32_arg(m, "adamw_update", "m");
  float* v0 = f32_arg(v, "adamw_update", "v");
  check_float(grad, "adamw_update", "grad");
  for_chunks(n, [&](int64_t off, int64_t len) {
    Stage stage;
    adamw_elements(param0 + off, m0 + off, v0 + off, stage.in(grad, off, len), len, a);
  });
}

void sgd_update(Tensor param, Tensor grad, Tensor momentum_buf, float lr, float momentum,
                float weight_decay, int64_t step, float grad_scale) {
  const int64_t n = param.numel();
  TESSERA_CHECK(grad.numel() == n, "sgd: param " + shape_str(param.shape) + ", grad " + shape_str(grad.shape));
  TESSERA_CHECK(step >= 1, "sgd: step is 1-based");
  float* param0 = f32_arg(param, "sgd_update", "param");
  float* buf0 = momentum == 0.0f ? nullptr : f32_arg(momentum_buf, "sgd_update", "momentum_buf");
  check_float(grad, "sgd_update", "grad");
  if (momentum != 0.0f)
    TESSERA_CHECK(buf0 && momentum_buf.numel() == n, "sgd: momentum buffer " + shape_str(momentum_buf.shape));
  for_chunks(n, [&](int64_t off, int64_t len) {
    Stage stage;
    sgd_elements(param0 + off, buf0 ? buf0 + off : nullptr, stage.in(grad, off, len), len, lr, momentum,
                 weight_decay, step == 1, grad_scale);
  });
}

void multi_tensor_adamw(Tensor main, Tensor param, Tensor grad, Tensor m, Tensor v, Tensor chunks, Tensor scalars,
                        float beta1, float beta2, float eps) {
  const int64_t rows = check_slab_update("multi_tensor_adamw", main, param, grad, chunks, scalars);
  float* main0 = f32_arg(main, "multi_tensor_adamw", "main");
  float* m0 = f32_arg(m, "multi_tensor_adamw", "m");
  float* v0 = f32_arg(v, "multi_tensor_adamw", "v");
  const float* g0 = f32_arg(grad, "multi_tensor_adamw", "grad");
  const float* s = f32_arg(scalars, "multi_tensor_adamw", "scalars");
  const int64_t* table = reinterpret_cast<const int64_t*>(cpu_memory(chunks));
  AdamScalars a = adam_constants(beta1, beta2, eps);
  a.step_size = s[kAdamStepSize];
  a.bc2_sqrt = s[kAdamBc2Sqrt];
  a.grad_scale = s[kGradScale];
  for (int64_t c = 0; c < rows; ++c) check_row("multi_tensor_adamw", table + c * kChunkColumns, main, param, grad, m);
#pragma omp parallel for schedule(static)
  for (int64_t c = 0; c < rows; ++c) {
    const int64_t* row = table + c * kChunkColumns;
    AdamScalars chunk = a;
    chunk.decay = row[kChunkDecay] ? s[kAdamDecay] : 1.0f;  // adamw_update's 1 - lr * 0
    float* p = main0 + row[kChunkMain];
    float* mm = m0 + row[kChunkState];
    float* vv = v0 + row[kChunkState];
    const float* g = g0 + row[kChunkGrad];
    update_chunk(param, row, p, [&](int64_t off, int64_t len) {
      prefetch_line(off + kAhead, row[kChunkNumel], p, mm, vv, g);
      adamw_elements(p + off, mm + off, vv + off, g + off, len, chunk);
    });
  }
}

void multi_tensor_sgd(Tensor main, Tensor param, Tensor grad, Tensor momentum_buf, Tensor chunks, Tensor scalars,
                      float momentum) {
  const int64_t rows = check_slab_update("multi_tensor_sgd", main, param, grad, chunks, scalars);
  float* main0 = f32_arg(main, "multi_tensor_sgd", "main");
  float* buf0 = momentum == 0.0f ? nullptr : f32_arg(momentum_buf, "multi_tensor_sgd", "momentum_buf");
  if (momentum != 0.0f) TESSERA_CHECK(buf0 != nullptr, "multi_tensor_sgd: momentum without a momentum buffer");
  const float* g0 = f32_arg(grad, "multi_tensor_sgd", "grad");
  const float* s = f32_arg(scalars, "multi_tensor_sgd", "scalars");
  const int64_t* table = reinterpret_cast<const int64_t*>(cpu_memory(chunks));
  const Tensor state = buf0 ? momentum_buf : Tensor();
  for (int64_t c = 0; c < rows; ++c) check_row("multi_tensor_sgd", table + c * kChunkColumns, main, param, grad, state);
#pragma omp parallel for schedule(static)
  for (int64_t c = 0; c < rows; ++c) {
    const int64_t* row = table + c * kChunkColumns;
    float* p = main0 + row[kChunkMain];
    float* buf = buf0 ? buf0 + row[kChunkState] : nullptr;
    const float* g = g0 + row[kChunkGrad];
    const float decay = row[kChunkDecay] ? s[kWeightDecay] : 0.0f;
    update_chunk(param, row, p, [&](int64_t off, int64_t len) {
      sgd_elements(p + off, buf ? buf + off : nullptr, g + off, len, s[kLr], momentum, decay, s[kSgdFirst] != 0.0f,
                   s[kGradScale]);
    });
  }
}

}  // namespace tessera::ops::cpu
