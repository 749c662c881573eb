// Which kernel serves a call of CUDA's fused attention (ops.inc flash_attention_*): cuDNN's
// fused SDPA (cudnn_attention.h) where it gives the op's contract, tessera's own flash kernel
// (ops/kernels/flash_attention.cl, the one OpenCL runs) everywhere else. A plain function of
// the call's sizes, so the choice is tested on the CPU (tests/unit/ops/cuda_flash_route_test.cpp).
//
// cuDNN serves 16-bit runs (qkv, out and the gradients in one of bf16 / f16, f32 accumulation)
// on sm_80 and later, head dims that are multiples of 8 up to 128 and 16-byte aligned tensors.
// Attention dropout stays on tessera's kernel: the op's contract is the unfused op's mask
// (Philox element (head*T + query)*T + key), and cuDNN's dropout draws its own bits from its
// seed and offset (so the CUDA backend tells the model to run the unfused attention when
// attention dropout is on: Backend::fused_attention_dropout). cuDNN reads Q, K and V in
// place from Megatron's grouped qkv when the query heads are one strided tensor (plain
// attention, R = 1, or one query group, NG = 1) and nothing is rotated; otherwise (RoPE, or
// grouped-query attention with several groups of several heads) the call first lays qkv out
// per head with attention_qkv_forward (rotating q and k), and the backward adds its gradient
// back through attention_qkv_backward.
#pragma once

#include <cstdint>
#include <string>

#include "tessera/core/dtype.h"

namespace tessera::ops::cuda {

struct FlashCall {
  int64_t NH = 0, NG = 0, HD = 0;
  DType dtype = DType::F32;  // every activation and gradient tensor's, or F32 when they differ
  int64_t rope_dim = 0;
  float dropout_p = 0;
  bool aligned = false;  // every tensor's first element 16-byte aligned
};

// "" when cuDNN serves the call, else why not ("f32 activations", "sm_75 < sm_80", ...).
// `sm`: the GPU's compute capability as 10*major + minor; `have_cudnn`: the build has cuDNN.
inline std::string cudnn_refusal(const FlashCall& c, int sm, bool have_cudnn) {
  if (!have_cudnn) return "this build has no cuDNN";
  if (sm < 80) return "sm_" + std::to_string(sm) + " < sm_80";
  if (c.dtype != DType::BF16 && c.dtype != DType::F16) return "activations are not all bf16 or all f16";
  if (c.HD % 8 != 0 || c.HD > 128) return "head dim " + std::to_string(c.HD) + " (cuDNN: a multiple of 8 up to 128)";
  if (c.dropout_p != 0) return "attention dropout (the unfused op's mask)";
  if (!c.aligned) return "tensors not 16-byte aligned";
  return "";
}

// Whether cuDNN needs qkv laid out per head first (attention_qkv_forward): RoPE, or query
// heads that are not one strided tensor of the grouped layout.
inline bool per_head_copy(const FlashCall& c) { return c.rope_dim != 0 || (c.NG != c.NH && c.NG != 1); }

}  // namespace tessera::ops::cuda
