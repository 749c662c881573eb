// Causal self-attention on CUDA, llm.c-style (llmc/attention.cuh): the products as strided
// batches of cuBLASLt GEMMs over the BH = B*NH heads (cublaslt_gemm.h: f32 operands, f32
// accumulation, TF32 only under --tf32), the causal softmax, its dropout and its backward
// as kernels of attention_kernels.cuh (legend and layouts there). The contract of ops.h and
// ops/cpu/attention.cpp: att saves the probabilities before dropout in att's dtype (zeros
// above the diagonal; attention_buffers as OpenCL's, in attention_host.inc), the output
// multiplies the f32 probabilities, the backward the saved ones, dqkv accumulates. 16-bit
// qkv, dout: widened once into f32 blocks; out and dqkv rounded once.
//
// Per head (row-major [rows, cols], every matrix contiguous; Q, K, V, dO, dQ, dK, dV [T,HD]):
//   forward:  S  = Q K^T              the softmax kernel: S -> att, P' = att * dropout
//             O  = P' V
//   backward: P' = att * dropout      (into the op's scratch [BH,T,T])
//             dV = P'^T dO
//             dP = dO V^T             (overwrites P' in scratch: stream order)
//                                      the softmax backward kernel: dP -> dS (times the scale)
//             dQ = dS K,  dK = dS^T Q
// The GEMMs multiply the full [T,T] (llm.c does too): the zeros above the diagonal of P'
// and dS keep every sum causal.
// The attention_qkv ops (the grouped layout and RoPE) run the native kernels of
// rope_kernels.h in the default mode where the two tensors share a dtype, and the shared
// kernels (attention_host.inc) in --deterministic-mode, whose bits they keep.
#include "tessera/ops/cuda/cublaslt_gemm.h"
#include "tessera/ops/cuda/cuda_launch.h"
#include "tessera/ops/cuda/cuda_ops.h"
#include "tessera/ops/cuda/rope_kernels.h"

#define TESSERA_BACKEND cuda
#define TESSERA_OWN_ATTENTION_CORE
#define TESSERA_OWN_ATTENTION_QKV
#include "tessera/ops/kernels/attention_host.inc"
#undef TESSERA_OWN_ATTENTION_QKV
#undef TESSERA_OWN_ATTENTION_CORE
#undef TESSERA_BACKEND

namespace tessera::ops::cuda {
namespace {

// Threads per block of the row kernels (attention_softmax_*: one block per row).
constexpr int64_t kRowThreads = 256;

// C = op(A) @ op(B) for each of the BH heads, all f32 [rows, cols] row-major matrices
// stored contiguously, head after head: A is [M,K] ([K,M] when ta), B [K,N] ([N,K] when tb),
// C [M,N]. So a leading dimension is the stored column count (lda = ta ? M : K, ldb = tb ?
// K : N, ldc = N) and the batch strides are the matrix sizes (M*K, K*N, M*N).
void head_gemm(Device& device, int64_t BH, bool ta, bool tb, int64_t M, int64_t N, int64_t K, const float* A,
               const float* B, float* C) {
  gemm(device, CUDA_R_32F, ta, tb, M, N, K, A, ta ? M : K, B, tb ? K : N, 0.0f, C, N, nullptr, CUDA_R_32F,
       {.count = BH, .stride_a = M * K, .stride_b = K * N, .stride_c = M * N});
}

// blocks (f32 [parts][BH][T][HD]) = the heads of x ([B,T,NH*parts*HD]), widened.
void heads_to_blocks(float* blocks, const Tensor& x, const AttentionDims& d, int64_t parts) {
  CudaLaunch(x, "attention_heads_to_blocks")
      .pointer(blocks)
      .floats(x)
      .scalar<int64_t>(d.B)
      .scalar<int64_t>(d.T)
      .scalar<int64_t>(d.NH)
      .scalar<int64_t>(parts)
      .scalar<int64_t>(d.HD)
      .run(d.NH * parts * d.HD, d.B * d.T);
}

// The inverse: x = blocks, or x += blocks (accumulate), rounded once into x's dtype.
void blocks_to_heads(const Tensor& x, const float* blocks, const AttentionDims& d, int64_t parts, bool accumulate) {
  CudaLaunch(x, "attention_blocks_to_heads")
      .floats(x)
      .pointer(blocks)
      .scalar<int64_t>(d.B)
      .scalar<int64_t>(d.T)
      .scalar<int64_t>(d.NH)
      .scalar<int64_t>(parts)
      .scalar<int64_t>(d.HD)
      .scalar<int32_t>(accumulate ? 1 : 0)
      .run(d.NH * parts * d.HD, d.B * d.T);
}

// One of the row kernels (softmax forward or backward) over every [T,T] row in place.
void softmax_rows(const char* kernel, float* rows, const Tensor& att, const AttentionDims& d,
                  const Dropout& dropout) {
  CudaLaunch(att, kernel)
      .pointer(rows)
      .floats(att)
      .scalar<int64_t>(d.T)
      .scalar<int64_t>(d.NH)
      .scalar<float>(1.0f / std::sqrt(static_cast<float>(d.HD)))
      .dropout(dropout)
      .run(kRowThreads * d.T, d.B * d.NH);
}

size_t f32_bytes(int64_t n) { return static_cast<size_t>(n) * sizeof(float); }

// The native attention_qkv kernels serve a call outside --deterministic-mode on tensors of
// one dtype whose angles fit their by-value table.
bool native_qkv(const Tensor& a, const Tensor& b, const cpu::QkvLayout& s) {
  return !a.device->deterministic_mode() && a.dtype == b.dtype && s.half <= native::kMaxRopeAngles;
}

native::QkvShape qkv_shape(const cpu::QkvLayout& s) { return {s.T, s.NG, s.R, s.HD, s.half}; }

// The CPU's inverse frequencies (ops.h rope_inv_freq), a few hundred pow calls per call.
native::RopeFreqs rope_freqs(const Rope& rope, int64_t half) {
  native::RopeFreqs f{};
  for (int64_t i = 0; i < half; ++i) f.inv_freq[i] = rope_inv_freq(rope, i);
  return f;
}

}  // namespace

void attention_qkv_forward(Tensor out, Tensor qkv, int64_t num_groups, const Rope& rope) {
  const cpu::QkvLayout s = cpu::qkv_layout(qkv, out, num_groups, rope, "attention_qkv_forward");
  if (!native_qkv(out, qkv, s)) return shared_attention_qkv_forward(out, qkv, num_groups, rope);
  check_floating("attention_qkv_forward", {{"out", out}, {"qkv", qkv}});
  native::attention_qkv_forward(out.dtype, memory(out), memory(qkv), s.B * s.T, qkv_shape(s), rope_freqs(rope, s.half),
                                stream_of(out));
}

void attention_qkv_backward(Tensor dqkv, Tensor dout, int64_t num_groups, const Rope& rope) {
  if (dqkv.empty()) return;
  const cpu::QkvLayout s = cpu::qkv_layout(dqkv, dout, num_groups, rope, "attention_qkv_backward");
  if (!native_qkv(dqkv, dout, s)) return shared_attention_qkv_backward(dqkv, dout, num_groups, rope);
  check_floating("attention_qkv_backward", {{"dqkv", dqkv}, {"dout", dout}});
  native::attention_qkv_backward(dqkv.dtype, memory(dqkv), memory(dout), s.B * s.T, qkv_shape(s),
                                 rope_freqs(rope, s.half), stream_of(dqkv));
}

void attention_forward(Tensor out, Tensor att, Tensor qkv, const Dropout& dropout) {
  const AttentionDims d = attention_dims(att, qkv, out);
  check_dropout(dropout);
  check_floating("attention_forward", {{"out", out}, {"att", att}, {"qkv", qkv}});
  const int64_t BH = d.B * d.NH, T = d.T, HD = d.HD, n = BH * T * HD;  // n: one part of the blocks
  Device& device = *out.device;
  const Pieces scratch(device, {f32_bytes(BH * T * T), f32_bytes(3 * n), f32_bytes(n)});
  auto* scores = static_cast<float*>(scratch[0]);
  auto* q = static_cast<float*>(scratch[1]);  // then k at +n, v at +2n
  auto* o = static_cast<float*>(scratch[2]);
  heads_to_blocks(q, qkv, d, 3);
  head_gemm(device, BH, false, true, T, T, HD, q, q + n, scores);  // S = Q K^T
  softmax_rows("attention_softmax_forward", scores, att, d, dropout);
  head_gemm(device, BH, false, false, T, HD, T, scores, q + 2 * n, o);  // O = P' V
  blocks_to_heads(out, o, d, 1, false);
}

void attention_backward(Tensor dqkv, Tensor scratch, Tensor dout, Tensor qkv, Tensor att, const Dropout& dropout) {
  const AttentionDims d = attention_dims(att, qkv, dout);
  TESSERA_CHECK(dqkv.numel() == qkv.numel() && scratch.numel() == att.numel(),
                "attention backward: dqkv " + shape_str(dqkv.shape) + ", scratch " + shape_str(scratch.shape));
  check_dropout(dropout);
  check_floating("attention_backward", {{"dqkv", dqkv}, {"dout", dout}, {"qkv", qkv}, {"att", att}});
  check_f32("attention_backward", {{"scratch", scratch}});
  const int64_t BH = d.B * d.NH, T = d.T, HD = d.HD, n = BH * T * HD;
  Device& device = *dout.device;
  const Pieces blocks(device, {f32_bytes(3 * n), f32_bytes(n), f32_bytes(3 * n)});
  auto* q = static_cast<float*>(blocks[0]);  // k at +n, v at +2n
  auto* g = static_cast<float*>(blocks[1]);  // dO
  auto* dq = static_cast<float*>(blocks[2]);  // dk at +n, dv at +2n
  float* rows = f32(scratch);                 // P', then dP, then dS
  heads_to_blocks(q, qkv, d, 3);
  heads_to_blocks(g, dout, d, 1);
  CudaLaunch(att, "attention_dropped_probabilities")
      .pointer(rows)
      .floats(att)
      .scalar<int64_t>(T)
      .scalar<int64_t>(d.NH)
      .dropout(dropout)
      .run(T * T, BH);
  head_gemm(device, BH, true, false, T, HD, T, rows, g, dq + 2 * n);  // dV = P'^T dO
  head_gemm(device, BH, false, true, T, T, HD, g, q + 2 * n, rows);   // dP = dO V^T
  softmax_rows("attention_softmax_backward", rows, att, d, dropout);
  head_gemm(device, BH, false, false, T, HD, T, rows, q + n, dq);  // dQ = dS K
  head_gemm(device, BH, true, false, T, HD, T, rows, q, dq + n);   // dK = dS^T Q
  blocks_to_heads(dqkv, dq, d, 3, true);
}

}  // namespace tessera::ops::cuda
