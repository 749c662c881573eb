// The kernels of the GPT model, each an explicit forward and backward on Tensors,
// dispatched by the tensor's device (only the CPU backend exists so far).
//
// Conventions, identical on every backend:
// - Arguments: outputs first, then inputs, then sizes and settings.
// - Every backward ACCUMULATES (+=) into every gradient output, parameters and inputs
//   alike, so gradient accumulation over micro-batches and the residual stream need no
//   extra adds. Callers zero gradient buffers when a new accumulation starts.
// - An empty Tensor (ptr == nullptr) for an optional input (bias) or gradient output
//   means "absent" / "not needed".
// - All floating tensors are f32 for now.
//
// Shape legend: B batch, T sequence, C hidden, V padded vocabulary, NH heads (local to
// this rank), HD head dim, OC output channels, N rows (= B*T), P positions table size.
#pragma once

#include <cstdint>

#include "tessera/core/rng.h"
#include "tessera/core/tensor.h"

namespace tessera::ops {

// Where a dropout's random draws come from. Element e of sample b is kept iff the Philox
// draw at counter {(element_offset+e)/4, sample0+b, key.site, key.iteration}, lane
// (element_offset+e)%4, is >= p; kept elements are scaled by 1/(1-p). element_offset
// places a shard (heads of a TP rank, rows of a sequence-parallel rank) inside the full
// per-sample tensor so every layout draws the same mask. p == 0 disables dropout.
struct Dropout {
  float p = 0.0f;
  DropoutKey key;
  uint32_t sample0 = 0;         // global index of the batch's first sample
  uint64_t element_offset = 0;  // offset of this shard inside one sample's full tensor
};

// out[B,T,C] = wte[tokens[b,t], :] + wpe[positions[b,t], :]; tokens, positions: i32 [B,T].
void embedding_forward(Tensor out, Tensor tokens, Tensor positions, Tensor wte, Tensor wpe);
void embedding_backward(Tensor dwte, Tensor dwpe, Tensor dout, Tensor tokens, Tensor positions);

// LayerNorm over the last dim: out = (inp - mean) * rstd * weight + bias.
// inp, out: [N,C]; weight, bias: [C]; saves mean, rstd: [N].
void layernorm_forward(Tensor out, Tensor mean, Tensor rstd, Tensor inp, Tensor weight, Tensor bias,
                       float eps);
void layernorm_backward(Tensor dinp, Tensor dweight, Tensor dbias, Tensor dout, Tensor inp, Tensor weight,
                        Tensor mean, Tensor rstd);

// out[N,OC] = inp[N,C] @ weight[OC,C]^T + bias[OC] (Megatron's [out, in] weight layout).
void linear_forward(Tensor out, Tensor inp, Tensor weight, Tensor bias);
void linear_backward(Tensor dinp, Tensor dweight, Tensor dbias, Tensor dout, Tensor inp, Tensor weight);

// Causal self-attention. qkv: [B,T,NH*3*HD] in Megatron's per-head [q;k;v] layout (for
// head h, q = qkv[..., h*3*HD : h*3*HD+HD], then k, then v). Scores are scaled by
// 1/sqrt(HD); att: [B,NH,T,T] saves the softmax probabilities (before dropout, zeros above
// the diagonal); out: [B,T,NH*HD]. Attention dropout acts on the probabilities; its
// per-sample element index is (head*T + query)*T + key over the full head count.
void attention_forward(Tensor out, Tensor att, Tensor qkv, const Dropout& dropout);
// scratch: [B,NH,T,T] workspace (no meaning outside the call).
void attention_backward(Tensor dqkv, Tensor scratch, Tensor dout, Tensor qkv, Tensor att,
                        const Dropout& dropout);

enum class GeluKind { Tanh, Erf };  // Megatron: tanh with bias-gelu fusion / --openai-gelu, erf otherwise
void gelu_forward(Tensor out, Tensor inp, GeluKind kind);
void gelu_backward(Tensor dinp, Tensor dout, Tensor inp, GeluKind kind);

// out[B,...] = inp * mask / (1-p); the per-sample element index is the flat index within
// one sample. out may alias inp.
void dropout_forward(Tensor out, Tensor inp, const Dropout& dropout);
void dropout_backward(Tensor dinp, Tensor dout, const Dropout& dropout);

// out = a + b; backward: da += dout, db += dout.
void residual_forward(Tensor out, Tensor a, Tensor b);
void residual_backward(Tensor da, Tensor db, Tensor dout);

// losses[N] = logsumexp(logits[n,:]) - logits[n, targets[n]] over the whole padded vocab.
// logits: [N,V] f32; targets: i32 [N].
void cross_entropy_forward(Tensor losses, Tensor logits, Tensor targets);
// dlogits[n,:] += (softmax(logits[n,:]) - onehot(targets[n])) * dlosses[n].
void cross_entropy_backward(Tensor dlogits, Tensor dlosses, Tensor logits, Tensor targets);
// The same, given the forward's losses for these logits (logsumexp = loss + target logit):
// one pass over the logits instead of three. Prefer it when the losses are kept.
void cross_entropy_backward(Tensor dlogits, Tensor dlosses, Tensor logits, Tensor targets, Tensor losses);

// Decoupled-weight-decay Adam (torch.optim.AdamW / Apex FusedAdam adam_w_mode) on one
// tensor: p -= lr*wd*p; m, v moments; bias-corrected with step t (1-based).
// grad_scale multiplies the gradient as it is read (grad itself is left as is): the same
// bits as scale_inplace(grad, grad_scale) first, without that extra pass over memory, so
// clipping (and loss-scale unscaling) can fold into the update.
void adamw_update(Tensor param, Tensor grad, Tensor m, Tensor v, float lr, float beta1, float beta2,
                  float eps, float weight_decay, int64_t step, float grad_scale = 1.0f);
// torch.optim.SGD with momentum and coupled (L2) weight decay; momentum_buf starts at zero
// and on step 1 is set to the gradient, as torch does. grad_scale as for adamw_update.
void sgd_update(Tensor param, Tensor grad, Tensor momentum_buf, float lr, float momentum,
                float weight_decay, int64_t step, float grad_scale = 1.0f);

// Sum of squares in double (a partial of the global gradient norm).
double sum_squares(Tensor t);
// t *= scale.
void scale_inplace(Tensor t, float scale);

}  // namespace tessera::ops
