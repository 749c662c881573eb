// Which kernel serves CUDA's fused attention (ops/cuda/flash_route.h), decided on the CPU from
// the call's sizes: cuDNN for 16-bit, undropped, aligned calls on sm_80+ with head dims of
// 8k <= 128 (RoPE and grouped query heads through a per-head copy); tessera's own flash kernel
// for everything else, each refusal saying why.
#include <gtest/gtest.h>

#include "tessera/ops/cuda/flash_route.h"

using namespace tessera;
using tessera::ops::cuda::cudnn_refusal;
using tessera::ops::cuda::FlashCall;
using tessera::ops::cuda::per_head_copy;

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
  EXPECT_FALSE(per_head_copy(gpt2()));
  EXPECT_FALSE(per_head_copy(one_group));
}

TEST(CudaFlashRoute, RopeAndGroupedQueryHeadsGoThroughAPerHeadCopy) {
  FlashCall llama = gpt2();  // Llama 3.2 1B: 32 heads in 8 groups, RoPE on the whole head
  llama.NH = 32;
  llama.NG = 8;
  llama.rope_dim = 64;
  EXPECT_EQ(cudnn_refusal(llama, 90, true), "");
  EXPECT_TRUE(per_head_copy(llama));
  llama.rope_dim = 0;
  EXPECT_TRUE(per_head_copy(llama));
  FlashCall rotated = gpt2();
  rotated.rope_dim = 32;
  EXPECT_TRUE(per_head_copy(rotated));
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
  c.dropout_p = 0.1f;
  EXPECT_EQ(cudnn_refusal(c, 90, true), "attention dropout (the unfused op's mask)");
  c = gpt2();
  c.aligned = false;
  EXPECT_EQ(cudnn_refusal(c, 90, true), "tensors not 16-byte aligned");
}
