// cuDNN's fused attention (SDPA) through the cuDNN frontend's graph API, for CUDA's
// flash_attention_* ops where flash_route.h says cuDNN serves the call: the forward with its
// statistics (the log-sum-exp of each row, the op's lse), the backward from them, causal, f32
// accumulation. Q, K and V are read in place from Megatron's grouped qkv where the query
// heads are one strided tensor and nothing is rotated (K and V of each group shared by its
// heads: no repeated heads); else (flash_route.h's per_head_copy) from a per-head copy made
// by attention_qkv_forward (RoPE applied), whose gradient attention_qkv_backward adds back.
// One graph is built per shape and dtype on each GPU, planned once (heuristics, then the
// plan's workspace) and kept; a call binds its pointers and runs on the device's default
// stream. The backward runs cuDNN's deterministic algorithm.
#pragma once

#include "tessera/core/tensor.h"
#include "tessera/ops/ops.h"
#include "tessera/ops/cpu/shape_checks.h"

namespace tessera::ops::cuda {

// Each returns false, having done nothing, when cuDNN refused to build the shape's graph (a
// warning says so once per shape); the caller then runs the shared flash kernel.
// out, lse as flash_attention_forward's, qkv grouped with d's sizes.
bool cudnn_attention_forward(const Tensor& out, const Tensor& lse, const Tensor& qkv, const cpu::FlashLayout& d,
                             const Rope& rope);
// dqkv += the gradient (cuDNN writes dq, dk, dv into scratch of the device, then one add, or
// attention_qkv_backward from the per-head copy's gradient).
bool cudnn_attention_backward(const Tensor& dqkv, const Tensor& dout, const Tensor& qkv, const Tensor& out,
                              const Tensor& lse, const cpu::FlashLayout& d, const Rope& rope);

}  // namespace tessera::ops::cuda
