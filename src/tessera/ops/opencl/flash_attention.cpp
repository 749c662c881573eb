// OpenCL's fused attention: the shared kernels of ops/kernels/flash_attention_host.inc.
#include "tessera/ops/opencl/cl_launch.h"
#include "tessera/ops/opencl/opencl_ops.h"

#define TESSERA_BACKEND opencl
#include "tessera/ops/kernels/flash_attention_host.inc"
#undef TESSERA_BACKEND

namespace tessera::ops::opencl {

void flash_attention_forward(Tensor out, Tensor lse, Tensor qkv, Tensor kv, int64_t num_groups, const Rope& rope,
                             const Dropout& dropout, const AttentionBlock& block) {
  shared_flash_attention_forward(out, lse, qkv, kv, num_groups, rope, dropout, block);
}

void flash_attention_backward(Tensor dqkv, Tensor dkv, Tensor scratch, Tensor dout, Tensor qkv, Tensor kv, Tensor out,
                              Tensor lse, int64_t num_groups, const Rope& rope, const Dropout& dropout,
                              const AttentionBlock& block) {
  shared_flash_attention_backward(dqkv, dkv, scratch, dout, qkv, kv, out, lse, num_groups, rope, dropout, block);
}

// D = rowsum(dout * out) per row, f32.
Shape flash_attention_scratch(const Device&, int64_t B, int64_t NH, int64_t T) { return {B, NH, T}; }

}  // namespace tessera::ops::opencl
