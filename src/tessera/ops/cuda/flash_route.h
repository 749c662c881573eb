// Which kernel serves a call of CUDA's fused attention (ops.inc flash_attention_*): cuDNN's
// fused SDPA (cudnn_attention.h) where it gives the op's contract, tessera's own flash kernel
// (ops/kernels/flash_attention.cl, the one OpenCL runs) everywhere else. A plain function of
// the call's sizes, so the choice is tested on the CPU (tests/unit/ops/cuda_flash_route_test.cpp).
//
// cuDNN serves 16-bit runs (qkv, out and the gradients in one of bf16 / f16, f32 accumulation)
// on sm_80 and later, head dims that are multiples of 8 up to 128, 16-byte aligned tensors, no
// RoPE (the model's flash call passes the rotation into the kernel; cuDNN has no rotation) and
// query heads that are one strided tensor in Megatron's grouped layout (plain attention, R = 1,
// or one query group, NG = 1). Attention dropout stays on tessera's kernel: the op's contract is
// the unfused op's mask (Philox element (head*T + query)*T + key), and cuDNN's dropout draws its
// own bits from its seed and offset.
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
  if (c.rope_dim != 0) return "RoPE inside the kernel";
  if (c.dropout_p != 0) return "attention dropout (the unfused op's mask)";
  if (c.NG != c.NH && c.NG != 1) return "query groups of several heads in several groups";
  if (!c.aligned) return "tensors not 16-byte aligned";
  return "";
}

}  // namespace tessera::ops::cuda
