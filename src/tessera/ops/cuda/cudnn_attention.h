// cuDNN's fused attention (SDPA) through the cuDNN frontend's graph API, for CUDA's
// flash_attention_* ops where flash_route.h says cuDNN serves the call: the forward with its
// statistics (the log-sum-exp of each row, the op's lse), the backward from them, causal, f32
// accumulation, grouped-query attention with K and V read in place from Megatron's grouped
// qkv (no repeated heads). One graph is built per shape and dtype on each GPU, planned once
// (heuristics, then the plan's workspace) and kept; a call binds its pointers and runs on the
// device's default stream. The backward runs cuDNN's deterministic algorithm.
#pragma once

#include "tessera/core/tensor.h"
#include "tessera/ops/cpu/shape_checks.h"

namespace tessera::ops::cuda {

// out, lse as flash_attention_forward's, qkv grouped with d's sizes.
void cudnn_attention_forward(const Tensor& out, const Tensor& lse, const Tensor& qkv, const cpu::FlashLayout& d);
// dqkv += the gradient (cuDNN writes dq, dk, dv into scratch of the device, then one add).
void cudnn_attention_backward(const Tensor& dqkv, const Tensor& dout, const Tensor& qkv, const Tensor& out,
                              const Tensor& lse, const cpu::FlashLayout& d);

}  // namespace tessera::ops::cuda
