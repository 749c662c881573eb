// CUDA's fused attention: cuDNN's SDPA where flash_route.h says it serves the call
// (cudnn_attention.h), else the shared flash kernels (ops/kernels/flash_attention_host.inc,
// OpenCL's too). Both keep the op's contract (lse, causal, the grouped layout), so a forward
// of one and a backward of the other agree.
#include <cuda_runtime.h>

#include "tessera/ops/cuda/cuda_launch.h"
#include "tessera/ops/cuda/cuda_ops.h"
#include "tessera/ops/cuda/flash_route.h"
#ifdef TESSERA_WITH_CUDNN
#include "tessera/ops/cuda/cudnn_attention.h"
#endif

#define TESSERA_BACKEND cuda
#include "tessera/ops/kernels/flash_attention_host.inc"
#undef TESSERA_BACKEND

namespace tessera::ops::cuda {
namespace {

#ifdef TESSERA_WITH_CUDNN
constexpr bool kHaveCudnn = true;
#else
constexpr bool kHaveCudnn = false;
#endif

// 10 * major + minor of the tensor's GPU.
int compute_capability(const Device& device) {
  int major = 0, minor = 0;
  cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device.ordinal());
  cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device.ordinal());
  return 10 * major + minor;
}

bool aligned(std::initializer_list<const Tensor*> tensors) {
  for (const Tensor* t : tensors)
    if ((reinterpret_cast<uintptr_t>(t->handle) + t->offset) % 16 != 0) return false;
  return true;
}

// One dtype when every tensor has it, else F32 (which cuDNN refuses).
DType common_dtype(std::initializer_list<const Tensor*> tensors) {
  const DType first = (*tensors.begin())->dtype;
  for (const Tensor* t : tensors)
    if (t->dtype != first) return DType::F32;
  return first;
}

bool cudnn_serves(const cpu::FlashLayout& d, std::initializer_list<const Tensor*> tensors, const Tensor& lse,
                  const Rope& rope, const Dropout& dropout) {
  const FlashCall call{d.NH, d.NG, d.HD, common_dtype(tensors), rope.dim, dropout.p,
                       aligned(tensors) && aligned({&lse})};
  return cudnn_refusal(call, compute_capability(*lse.device), kHaveCudnn).empty();
}

// cuDNN serves the whole sequence attending to itself (no context-parallel block pair: its
// graphs know neither key positions apart from the queries' nor a merge into a running lse).
bool whole_sequence(const Tensor& kv, const AttentionBlock& block, int64_t T) {
  const auto at_start = [T](const SequenceRows& r) { return r.first == 0 && (r.split == 0 || r.split == T); };
  return kv.empty() && !block.merge && block.seq_length == T && at_start(block.queries) && at_start(block.keys);
}

}  // namespace

void flash_attention_forward(Tensor out, Tensor lse, Tensor qkv, Tensor kv, int64_t num_groups, const Rope& rope,
                             const Dropout& dropout, const AttentionBlock& block) {
#ifdef TESSERA_WITH_CUDNN
  const cpu::FlashLayout d = checked_layout(qkv, out, lse, num_groups, rope, dropout, "flash_attention_forward");
  if (whole_sequence(kv, cpu::checked_block(block, qkv, kv, "flash_attention_forward"), d.T) &&
      cudnn_serves(d, {&qkv, &out}, lse, rope, dropout) && cudnn_attention_forward(out, lse, qkv, d, rope))
    return;
#endif
  shared_flash_attention_forward(out, lse, qkv, kv, num_groups, rope, dropout, block);
}

void flash_attention_backward(Tensor dqkv, Tensor dkv, Tensor scratch, Tensor dout, Tensor qkv, Tensor kv, Tensor out,
                              Tensor lse, int64_t num_groups, const Rope& rope, const Dropout& dropout,
                              const AttentionBlock& block) {
#ifdef TESSERA_WITH_CUDNN
  if (!dqkv.empty()) {
    const cpu::FlashLayout d = checked_layout(qkv, out, lse, num_groups, rope, dropout, "flash_attention_backward");
    cpu::check_flash_backward(dqkv, dkv, scratch, dout, qkv, kv, out, lse);
    if (whole_sequence(kv, cpu::checked_block(block, qkv, kv, "flash_attention_backward"), d.T) &&
        cudnn_serves(d, {&dqkv, &dout, &qkv, &out}, lse, rope, dropout) &&
        cudnn_attention_backward(dqkv, dout, qkv, out, lse, d, rope))
      return;
  }
#endif
  shared_flash_attention_backward(dqkv, dkv, scratch, dout, qkv, kv, out, lse, num_groups, rope, dropout, block);
}

// D = rowsum(dout * out) per row for the shared kernel, f32 (cuDNN's workspace and gradient
// come from the device's scratch).
Shape flash_attention_scratch(const Device&, int64_t B, int64_t NH, int64_t T) { return {B, NH, T}; }

}  // namespace tessera::ops::cuda
