// Which kernel serves CUDA's fused attention (ops/cuda/flash_route.h), decided on the CPU from
// the call's sizes: cuDNN for 16-bit, unrotated, undropped, aligned calls on sm_80+ with head
// dims of 8k <= 128 and one query stride; tessera's own flash kernel for everything else, each
// refusal saying why.
#include <gtest/gtest.h>

#include "tessera/ops/cuda/flash_route.h"

using namespace tessera;
using tessera::ops::cuda::cudnn_refusal;
using tessera::ops::cuda::FlashCall;

namespace {

FlashCall gpt2() { return {12, 12, 64, DType::BF16, 0, 0.0f, true}; }

}  // namespace

TEST(CudaFlashRoute, CudnnServesSixteenBitAttention) {
  EXPECT_EQ(cudnn_refusal(gpt2(), 90, true), "");
  FlashCall f16 = gpt2();
  f16.dtype = DType::F16;
  EXPECT_EQ(cudnn_refusal(f16, 80, true), "");
  FlashCall one_group = gpt2();  // multi-query attention: every query head in one group
  one_group.NG = 1;
  EXPECT_EQ(cudnn_refusal(one_group, 90, true), "");
  FlashCall hd128 = gpt2();
  hd128.HD = 128;
  EXPECT_EQ(cudnn_refusal(hd128, 90, true), "");
}

TEST(CudaFlashRoute, EverythingElseRunsTheSharedKernelSayingWhy) {
  EXPECT_EQ(cudnn_refusal(gpt2(), 90, false), "this build has no cuDNN");
  EXPECT_EQ(cudnn_refusal(gpt2(), 75, true), "sm_75 < sm_80");
  FlashCall c = gpt2();
  c.dtype = DType::F32;
  EXPECT_EQ(cudnn_refusal(c, 90, true), "activations are not all bf16 or all f16");
  c = gpt2();
  c.HD = 60;
  EXPECT_EQ(cudnn_refusal(c, 90, true), "head dim 60 (cuDNN: a multiple of 8 up to 128)");
  c.HD = 256;
  EXPECT_NE(cudnn_refusal(c, 90, true), "");
  c = gpt2();
  c.rope_dim = 64;
  EXPECT_EQ(cudnn_refusal(c, 90, true), "RoPE inside the kernel");
  c = gpt2();
  c.dropout_p = 0.1f;
  EXPECT_EQ(cudnn_refusal(c, 90, true), "attention dropout (the unfused op's mask)");
  c = gpt2();
  c.NH = 32;
  c.NG = 8;  // Llama's grouped-query attention: query heads are not one strided tensor
  EXPECT_EQ(cudnn_refusal(c, 90, true), "query groups of several heads in several groups");
  c = gpt2();
  c.aligned = false;
  EXPECT_EQ(cudnn_refusal(c, 90, true), "tensors not 16-byte aligned");
}
