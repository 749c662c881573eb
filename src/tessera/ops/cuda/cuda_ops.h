// The CUDA backend of ops.h: host functions with exactly the signatures and contracts of
// ops.h (outputs first, every backward accumulates, empty tensor = absent), each launching
// kernels of kernels.cu (mostly the shared sources of ops/kernels) or cuBLASLt GEMMs on
// the device's default stream. Calls return once the work is enqueued; copies to the host
// wait for it. Its kernel table (kernel_table.cpp) serves devices of kind CUDA.
#pragma once

#include "tessera/ops/kernel_table.h"
#include "tessera/ops/ops.h"

namespace tessera::ops::cuda {

const KernelTable& kernel_table();

void embedding_forward(Tensor out, Tensor tokens, Tensor positions, Tensor wte, Tensor wpe, int64_t vocab_start,
                       int64_t vocab_size);
void embedding_backward(Tensor dwte, Tensor dwpe, Tensor dout, Tensor tokens, Tensor positions, int64_t vocab_start,
                        int64_t vocab_size);

void layernorm_forward(Tensor out, Tensor mean, Tensor rstd, Tensor inp, Tensor weight, Tensor bias, float eps);
void layernorm_backward(Tensor dinp, Tensor dweight, Tensor dbias, Tensor dout, Tensor inp, Tensor weight,
                        Tensor mean, Tensor rstd);

void rmsnorm_forward(Tensor out, Tensor rstd, Tensor inp, Tensor weight, float eps);
void rmsnorm_backward(Tensor dinp, Tensor dweight, Tensor dout, Tensor inp, Tensor weight, Tensor rstd);

void linear_forward(Tensor out, Tensor inp, Tensor weight, Tensor bias);
void linear_backward(Tensor dinp, Tensor dweight, Tensor dbias, Tensor dout, Tensor inp, Tensor weight);
void bias_add_forward(Tensor out, Tensor inp, Tensor bias);
void bias_add_backward(Tensor dbias, Tensor dout);

void attention_forward(Tensor out, Tensor att, Tensor qkv, const Dropout& dropout);
void attention_backward(Tensor dqkv, Tensor scratch, Tensor dout, Tensor qkv, Tensor att, const Dropout& dropout);
AttentionBuffers attention_buffers(const Device& device, int64_t B, int64_t NH, int64_t T, DType act_dtype);

void attention_qkv_forward(Tensor out, Tensor qkv, int64_t num_groups, const Rope& rope);
void attention_qkv_backward(Tensor dqkv, Tensor dout, int64_t num_groups, const Rope& rope);

void swiglu_forward(Tensor out, Tensor inp);
void swiglu_backward(Tensor dinp, Tensor dout, Tensor inp);

void gelu_forward(Tensor out, Tensor inp, GeluKind kind);
void gelu_backward(Tensor dinp, Tensor dout, Tensor inp, GeluKind kind);

void dropout_forward(Tensor out, Tensor inp, const Dropout& dropout);
void dropout_backward(Tensor dinp, Tensor dout, const Dropout& dropout);

void residual_forward(Tensor out, Tensor a, Tensor b);
void residual_backward(Tensor da, Tensor db, Tensor dout);

void cross_entropy_max(Tensor row_max, Tensor logits);
void cross_entropy_sums(Tensor sum_exp, Tensor target_logit, Tensor logits, Tensor targets, Tensor row_max,
                        int64_t vocab_start, int64_t vocab_size);
void cross_entropy_finish(Tensor losses, Tensor logsumexp, Tensor sum_exp, Tensor row_max, Tensor target_logit);
void cross_entropy_backward(Tensor dlogits, Tensor dlosses, Tensor logits, Tensor targets, Tensor logsumexp,
                            int64_t vocab_start, int64_t vocab_size);

void sequence_to_rank_major(Tensor out, Tensor inp, int parts);
void rank_major_to_sequence(Tensor out, Tensor inp, int parts);

void adamw_update(Tensor param, Tensor grad, Tensor m, Tensor v, float lr, float beta1, float beta2, float eps,
                  float weight_decay, int64_t step, float grad_scale);
void sgd_update(Tensor param, Tensor grad, Tensor momentum_buf, float lr, float momentum, float weight_decay,
                int64_t step, float grad_scale);

void sum_squares(Tensor sums, int64_t slot, Tensor t);
void masked_loss_sums(Tensor sums, Tensor losses, Tensor mask);
void masked_loss_backward(Tensor dlosses, Tensor mask, float scale);
void init_normal(Tensor out, float std, uint32_t seed, uint32_t tensor_id, ShardIndex where);
void fill(Tensor out, float value);
void convert(Tensor out, Tensor inp);
void scale_inplace(Tensor t, float scale);

}  // namespace tessera::ops::cuda
