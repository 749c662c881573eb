// The kernels of the GPT model, each an explicit forward and backward on Tensors,
// dispatched by the tensors' device to its backend's kernel table (kernel_table.h).
//
// Conventions, identical on every backend:
// - Arguments: outputs first, then inputs, then sizes and settings.
// - Every backward ACCUMULATES (+=) into its gradient outputs by default, parameters and
//   inputs alike, so gradient accumulation over micro-batches and the residual stream need
//   no extra adds. A backward whose input gradient is often a first contribution takes a
//   GradWrite: Assign overwrites that gradient instead, so the caller needs no zero fill
//   first. Parameter gradients always accumulate; callers zero them when a new
//   accumulation starts.
// - An empty Tensor (ptr == nullptr) for an optional input (bias) or gradient output
//   means "absent" / "not needed".
// - Storage dtypes (Megatron's Float16Module: 16-bit parameters and activations, fp32
//   main grads and optimizer state). Every floating tensor argument may be F32, BF16 or
//   F16, independently of the others, unless its op's comment says F32. Ops compute in
//   f32: each element is widened exactly on load; each stored result is rounded ONCE to
//   its tensor's dtype, round-to-nearest-even (bf16: core/dtype.h f32_to_bf16; f16: IEEE,
//   overflow to +-inf). An accumulating output (every backward's +=) is read, added to in
//   f32 and rounded once. So an op on 16-bit tensors gives the bits of the same op on f32
//   tensors holding the widened values, with its outputs rounded. All-F32 calls give the
//   bits they always did.
// - F32 only (the statistics Megatron keeps in fp32): LayerNorm's mean and rstd; the
//   cross-entropy's row_max, sum_exp, target_logit, logsumexp, losses and dlosses (its
//   logits and dlogits may be 16-bit: Megatron's cross-entropy takes .float() of them);
//   masked_loss's losses and mask; the optimizer updates' param, m, v and momentum_buf
//   (their grad may be any float dtype); attention's scratch. Integer tensors (tokens,
//   positions, targets: I32; the double slots: I64) are as each op says.
// - An op given a dtype it does not take throws an Error naming the op, the argument and
//   the dtype.
//
// Shape legend: B batch, T sequence, C hidden, V padded vocabulary, Vl the vocabulary rows
// (columns of logits) of this tensor-parallel rank, NH heads (local to this rank), HD head
// dim, OC output channels, N rows (= B*T), P positions table size.
#pragma once

#include <cstdint>

#include "tessera/core/rng.h"
#include "tessera/core/tensor.h"

namespace tessera {
class Device;
}

namespace tessera::ops {

// Where a dropout's random draws come from. Element e of sample b is kept iff the Philox
// draw at counter {(element_offset+e)/4, sample0+b, key.site, key.iteration}, lane
// (element_offset+e)%4, is >= p; kept elements are scaled by 1/(1-p). element_offset
// places a shard (heads of a TP rank, rows of a sequence-parallel rank) inside the full
// per-sample tensor so every layout draws the same mask. p == 0 disables dropout.
// How a backward writes its input (activation) gradient: Accumulate adds into it (+=),
// Assign overwrites it (=) without reading it, so it may hold anything, NaN included.
// Assign gives exactly the bits of Accumulate into a zero-filled tensor (each kernel adds
// its contribution to 0), so it is used in --deterministic-mode too.
enum class GradWrite { Accumulate, Assign };

struct Dropout {
  float p = 0.0f;
  DropoutKey key;
  uint32_t sample0 = 0;         // global index of the batch's first sample
  uint64_t element_offset = 0;  // offset of this shard inside one sample's full tensor
};

// Token + position embedding, with the token table optionally one vocabulary shard.
// tokens, positions: i32 [B,T]; out: [B,T,C]; wte: [Vl,C] holding rows
// [vocab_start, vocab_start+Vl) of the full padded vocabulary; wpe: [P,C].
//   out[b,t,:] = (wte present and vocab_start <= token < vocab_start+Vl ? wte[token - vocab_start] : 0)
//              + (wpe present ? wpe[position] : 0)
// Either table may be absent (empty Tensor); its index tensor is then not read (may be
// empty too). A vocabulary-parallel rank passes its shard and gets a partial sum that the
// tensor-parallel all-reduce completes (pass wpe on one rank only, or add it after the
// reduction with wte absent).
// vocab_size: the full padded vocabulary, for the bounds check only: every token must be
// in [0, vocab_size) and the shard inside it. 0 (the default) means unsharded: the table
// is the whole vocabulary, vocab_start must be 0 and vocab_size is taken as Vl. A rank
// holding the first shard that forgot vocab_size therefore fails loudly on the first
// token beyond its shard instead of silently dropping it.
// Who checks the ids: the CPU backend (and the strict test device, which runs it) checks
// every one, as above. A device backend does not read ids back, which would cost a host
// synchronisation per call: its kernels keep every access in bounds (a token outside the
// shard adds nothing, a position outside wpe adds nothing) and the caller validates ids
// where they are on the host. `tessera train` checks every dataset's ids against the padded
// vocabulary before it starts (data/token_id_range.h) and its positions are below
// seq_length <= max_position_embeddings; the cross-entropy's targets are the same tokens.
void embedding_forward(Tensor out, Tensor tokens, Tensor positions, Tensor wte, Tensor wpe,
                       int64_t vocab_start = 0, int64_t vocab_size = 0);
// dwte[token - vocab_start] += dout[b,t] for tokens in this shard only; dwpe[position] +=
// dout[b,t]. Either gradient may be absent. Bounds as for the forward.
void embedding_backward(Tensor dwte, Tensor dwpe, Tensor dout, Tensor tokens, Tensor positions,
                        int64_t vocab_start = 0, int64_t vocab_size = 0);

// LayerNorm over the last dim: out = (inp - mean) * rstd * weight + bias.
// inp, out: [N,C]; weight, bias: [C]; saves mean, rstd: [N].
void layernorm_forward(Tensor out, Tensor mean, Tensor rstd, Tensor inp, Tensor weight, Tensor bias,
                       float eps);
// write applies to dinp.
void layernorm_backward(Tensor dinp, Tensor dweight, Tensor dbias, Tensor dout, Tensor inp, Tensor weight,
                        Tensor mean, Tensor rstd, GradWrite write = GradWrite::Accumulate);

// RMSNorm over the last dim (Megatron's --normalization RMSNorm, torch.nn.RMSNorm):
// out = inp * rstd * weight, rstd = 1/sqrt(mean(inp^2) + eps), computed in f32 and rounded
// once. inp, out: [N,C]; weight: [C]; saves rstd: f32 [N].
void rmsnorm_forward(Tensor out, Tensor rstd, Tensor inp, Tensor weight, float eps);
void rmsnorm_backward(Tensor dinp, Tensor dweight, Tensor dout, Tensor inp, Tensor weight, Tensor rstd,
                      GradWrite write = GradWrite::Accumulate);

// out[N,OC] = inp[N,C] @ weight[OC,C]^T + bias[OC] (Megatron's [out, in] weight layout).
// backward: dinp += dout @ weight (= with GradWrite::Assign), dweight += dout^T @ inp,
// dbias += column sums of dout (the same reduction as bias_add_backward).
// Dtypes: any float dtype each (Megatron's --bf16 / --fp16 keep inp, weight, out and dinp
// in bf16 / f16); dweight and dbias are typically F32 (fp32 main grads:
// Megatron's gradient-accumulation fusion adds weight gradients straight into them). The
// products follow the operand dtypes (bf16 and f16 values are exact in f32, so a 16-bit
// GEMM with f32 accumulation is the same arithmetic as an f32 GEMM of the widened
// operands); each result is rounded once into out, or added into its gradient and rounded
// once.
void linear_forward(Tensor out, Tensor inp, Tensor weight, Tensor bias);
void linear_backward(Tensor dinp, Tensor dweight, Tensor dbias, Tensor dout, Tensor inp, Tensor weight,
                     GradWrite write = GradWrite::Accumulate);

// out[n,:] = inp[n,:] + bias; out, inp: [N,OC] (any leading dims), bias: [OC]. out may
// alias inp. A row-parallel linear runs linear_forward without bias, all-reduces (or
// reduce-scatters) the partial products, then adds its bias once with this.
void bias_add_forward(Tensor out, Tensor inp, Tensor bias);
// dbias[OC] += column sums of dout[N,OC]. The input gradient is dout itself (identity),
// so there is no dinp: the caller passes dout on.
void bias_add_backward(Tensor dbias, Tensor dout);

// Causal self-attention. qkv: [B,T,NH*3*HD] in Megatron's per-head [q;k;v] layout (for
// head h, q = qkv[..., h*3*HD : h*3*HD+HD], then k, then v). Scores are scaled by
// 1/sqrt(HD); out: [B,T,NH*HD]. att: what the forward saves for the backward, shaped as
// the backend's attention_buffers says: the CPU and OpenCL backends keep the softmax
// probabilities [B,NH,T,T] (before dropout, zeros above the diagonal); a flash-style
// kernel keeps a log-sum-exp [B,NH,T] and recomputes the rest. Attention dropout acts on
// the probabilities; its per-sample element index is (head*T + query)*T + key over the
// full head count. qkv, out, dout, dqkv and saved probabilities may be 16-bit; the output
// is computed from the f32 probabilities, the backward from the saved ones.
void attention_forward(Tensor out, Tensor att, Tensor qkv, const Dropout& dropout);
// scratch: workspace of attention_buffers' scratch shape (no meaning outside the call).
void attention_backward(Tensor dqkv, Tensor scratch, Tensor dout, Tensor qkv, Tensor att,
                        const Dropout& dropout);
// The shapes of attention's saved state and backward workspace on `device` for B samples,
// NH heads, T positions and activations (qkv, out) of dtype act_dtype: the backend's
// choice, which the model allocates. Softmax probabilities [B,NH,T,T] are saved in
// act_dtype (Megatron's fused softmax keeps its output in the input's precision), a
// log-sum-exp [B,NH,T] in F32; the scratch is F32. Scores and softmax are computed in f32
// (--attention-softmax-in-fp32).
struct AttentionBuffers {
  Shape saved;
  DType saved_dtype = DType::F32;
  Shape scratch;
};
AttentionBuffers attention_buffers(const Device& device, int64_t B, int64_t NH, int64_t T, DType act_dtype);

// Rotary position embedding (Megatron's --position-embedding-type rope, non-interleaved:
// megatron/core/models/common/embeddings/rope_utils.py). Channels [0, dim) of each query and
// key head are rotated, channel j < dim/2 paired with j + dim/2, by the angle
// t * inv_freq[j mod dim/2] of the token's position t in the sequence (0..T-1: the batch's
// position ids are not used, as in Megatron), inv_freq[i] = 1 / base^(2i/dim), inv_freq
// and the angle computed in f32 as Megatron does (fp32 arange, pow, outer product); cos and
// sin of the f32 angle to f32 accuracy (the CPU rounds double ones; devices use their f32
// cos, sin and pow, so backends agree to a few ulp of the angle, not bit for bit: PoCL
// within 4e-6 of the CPU at T = 4096). Channels [dim, HD) pass through. dim == 0: no
// rotation. With scaling, inv_freq is rope_inv_freq's.
//
// Llama 3.1's frequency scaling (Megatron's --use-rope-scaling: RotaryEmbedding._apply_scaling
// in megatron/core/models/common/embeddings/rotary_pos_embedding.py; transformers' rope_type
// "llama3"): of frequency f's wavelength w = 2*pi / f, with C = original_max_positions,
// w < C / high_freq_factor keeps f, w > C / low_freq_factor gives f / factor, and between
// the two s = (C / w - low_freq_factor) / (high_freq_factor - low_freq_factor) mixes them,
// (1 - s) * f / factor + s * f; each step in f32 as Megatron's torch code evaluates it.
struct RopeScaling {
  float factor = 0.0f;  // 0: no scaling
  float low_freq_factor = 1.0f;
  float high_freq_factor = 4.0f;
  float original_max_positions = 8192.0f;
};
struct Rope {
  int64_t dim = 0;  // even; kv_channels * --rotary-percent
  float base = 10000.0f;
  RopeScaling scaling;
};
// inv_freq[i] of `rope` for i < dim / 2, scaled when rope.scaling.factor > 0: the one C++
// evaluation (the CPU kernels' and the tests'); attention.cl's rope_inv_freq is the same
// formula for the OpenCL and CUDA kernels.
float rope_inv_freq(const Rope& rope, int64_t i);
// The fused QKV projection of (grouped-query) attention, laid out per head for
// attention_forward. qkv: [B,T,NG*(R+2)*HD] in Megatron's grouped layout (for query group
// g of NG, R = NH/NG query heads, then the group's key, then its value, each HD wide:
// megatron/core/transformer/attention.py get_query_key_value_tensors); out:
// [B,T,NH*3*HD], per head h = g*R + i: [q_h; k_g; v_g] with q and k rotated by `rope`.
// NG == NH with rope.dim == 0 is a plain copy (GPT's layout is the grouped one with R = 1).
// out must not overlap qkv (nor dqkv dout).
void attention_qkv_forward(Tensor out, Tensor qkv, int64_t num_groups, const Rope& rope);
// The head dim follows from the two widths (HD = (3*qkv width - out width) / (6*NG)).
// dqkv += the transpose: each head's dq rotated back (by -angle) into its q; the dk of each
// of the group's R heads rotated back and its dv, added into the group's k and v in head
// order (then rounded once, as every accumulating output).
void attention_qkv_backward(Tensor dqkv, Tensor dout, int64_t num_groups, const Rope& rope);

// Fused causal self-attention (FlashAttention's algorithm: Dao et al. 2022, FlashAttention-2),
// straight from Megatron's grouped projection: qkv [B,T,NG*(R+2)*HD] as attention_qkv_forward
// reads it (R = NH/NG query heads per group, then the group's key and value; GPT's layout is
// R = 1), without materialising repeated heads. q and k are rotated by `rope` (rope.dim == 0:
// none) as attention_qkv_forward rotates them; scores scaled by 1/sqrt(HD), keys t2 <= t only.
// out: [B,T,NH*HD] as attention_forward's; lse: f32 [B,NH,T], the log-sum-exp of each row of
// scaled scores, the only state the backward needs besides out (no [B,NH,T,T] buffer).
// Attention dropout acts on the probabilities with attention_forward's mask: element
// (head*T + query)*T + key of the sample over the full head count, so the same bits drop.
// Precision: OrderFree. Every sum (scores, the softmax's max and denominator, probabilities
// times values, the backward's) in f32 in the backend's own order: out, lse and dqkv within
// 2e-6, 2e-6 and 1e-5 of float64 relative to 1 + |value| on unit-scale f32 inputs, T <= 131
// (tests/unit/ops/flash_attention_test.cpp; the error grows with T as f32 sums do). Product16:
// in a 16-bit run (16-bit qkv) a backend may round the probabilities to qkv's dtype before
// they multiply the values, as FlashAttention and cuDNN do (the CPU and OpenCL kernels keep
// them in f32); outputs are then within a few units of the 16-bit dtype's last place.
void flash_attention_forward(Tensor out, Tensor lse, Tensor qkv, int64_t num_groups, const Rope& rope,
                             const Dropout& dropout);
// dqkv [B,T,NG*(R+2)*HD] += the gradient of out (dout) through the attention above,
// recomputing the probabilities tile by tile from qkv and lse; out is the forward's output
// (D = rowsum(dout * out) of the softmax backward). scratch: flash_attention_scratch's shape
// on this device, f32 (no meaning outside the call). Precision as the forward's.
void flash_attention_backward(Tensor dqkv, Tensor scratch, Tensor dout, Tensor qkv, Tensor out, Tensor lse,
                              int64_t num_groups, const Rope& rope, const Dropout& dropout);
// The f32 workspace flash_attention_backward wants on `device` for B samples, NH heads and T
// positions: the backend's choice, which the model allocates once.
Shape flash_attention_scratch(const Device& device, int64_t B, int64_t NH, int64_t T);

// SwiGLU (Megatron's --swiglu: megatron/core/transformer/mlp.py glu): inp: [N,2F], each
// row [gate | up] (this tensor-parallel rank's halves); out: [N,F] = silu(gate) * up,
// silu(x) = x / (1 + exp(-x)), in f32, rounded once. out must not overlap inp (nor dinp
// dout).
void swiglu_forward(Tensor out, Tensor inp);
void swiglu_backward(Tensor dinp, Tensor dout, Tensor inp, GradWrite write = GradWrite::Accumulate);

enum class GeluKind { Tanh, Erf };  // Megatron: tanh with bias-gelu fusion / --openai-gelu, erf otherwise
void gelu_forward(Tensor out, Tensor inp, GeluKind kind);
void gelu_backward(Tensor dinp, Tensor dout, Tensor inp, GeluKind kind, GradWrite write = GradWrite::Accumulate);

// out[B,...] = inp * mask / (1-p); the per-sample element index is the flat index within
// one sample. out may alias inp.
void dropout_forward(Tensor out, Tensor inp, const Dropout& dropout);
void dropout_backward(Tensor dinp, Tensor dout, const Dropout& dropout, GradWrite write = GradWrite::Accumulate);

// out = a + b; backward: da += dout, db += dout.
void residual_forward(Tensor out, Tensor a, Tensor b);
void residual_backward(Tensor da, Tensor db, Tensor dout);

// Fused epilogues: each the composition of the ops above in one pass over memory where the
// backend can, with the same contract otherwise. The model calls them outside
// --deterministic-mode (their roundings differ from the unfused ops') where the device
// supports them, and the unfused ops elsewhere.
//
// Linear + bias + GeLU (Megatron's bias-GeLU fusion; cuBLASLt's GELU_AUX_BIAS epilogue):
// pre[N,OC] = inp[N,C] @ weight[OC,C]^T + bias[OC] (bias may be absent), out = gelu(pre);
// pre is what the backward needs (cuBLASLt's aux). out must not overlap pre.
// Precision: OrderFree. The GEMM sums in the backend's order and the bias may be added
// after the product (linear_forward adds the GEMM onto it): in f32 each element of pre is
// within (C+1) * 2^-24 * (|bias| + sum_c |inp*weight|) of float64 (any summation order),
// out is gelu of pre to the gelu_* ops' accuracy; a 16-bit pre or out is rounded once more.
void linear_bias_gelu_forward(Tensor out, Tensor pre, Tensor inp, Tensor weight, Tensor bias, GeluKind kind);
// The backward in cuBLASLt's DGELU_BGRAD shape: dpre = dout * gelu'(pre) (ASSIGNED: dpre
// is a workspace, and may be dout itself), dbias += column sums of dpre from the same pass,
// then dinp (+)= dpre @ weight per `write`, dweight += dpre^T @ inp, as linear_backward.
// Precision: OrderFree, as linear_backward and gelu_backward (the column sums, of dpre as
// stored, in any order).
void linear_bias_gelu_backward(Tensor dinp, Tensor dweight, Tensor dbias, Tensor dpre, Tensor dout, Tensor inp,
                               Tensor weight, Tensor pre, GeluKind kind, GradWrite write = GradWrite::Accumulate);

// Bias + dropout + residual add (Megatron's bias_dropout_add_fused_train,
// megatron/core/fusions/fused_bias_dropout.py): out = residual + dropout(inp + bias) over
// [B,...] tensors with bias [OC] on the last dim (bias may be absent). The mask is
// dropout_forward's (the same Philox bits: ops.h Dropout, element index within a sample),
// so the same elements drop. out may alias inp or residual.
// Precision: OrderFree: in f32, out within 2^-22 * (|residual| + |(inp + bias) / (1-p)|)
// of float64 (the unfused ops round after each step, this op may fuse the multiply-add).
// With a 16-bit inp, inp + bias and its dropped value are rounded to inp's dtype, where
// the unfused ops store them: the CPU gives the unfused ops' bits.
void bias_dropout_add_forward(Tensor out, Tensor inp, Tensor bias, Tensor residual, const Dropout& dropout);
// dinp (+)= dropout_backward of dout per `write`; dbias += column sums of that, from the
// same pass; dresidual (+)= dout per `write` (absent when the caller keeps the residual
// gradient in dout, as the model does; it must not alias dout).
// Precision: OrderFree (the column sums, of the contributions as a 16-bit dinp stores them,
// in any order; the CPU keeps bias_add_backward's row order and gives the unfused bits).
void bias_dropout_add_backward(Tensor dinp, Tensor dbias, Tensor dresidual, Tensor dout, const Dropout& dropout,
                               GradWrite write = GradWrite::Accumulate);

// Softmax cross-entropy, vocabulary-parallel (Megatron's vocab_parallel_cross_entropy) in
// pieces; the caller reduces over the tensor-parallel ranks between them:
//   cross_entropy_max      -> all-reduce MAX of row_max
//   cross_entropy_sums     -> all-reduce SUM of sum_exp and of target_logit
//   cross_entropy_finish   -> losses and logsumexp (the same on every rank)
//   cross_entropy_backward -> this rank's columns of dlogits
// With one rank (vocab_start 0, no reductions) the pieces are the plain loss over the
// whole padded vocabulary. logits: [N,Vl] (any float dtype, as dlogits) holding columns
// [vocab_start, vocab_start+Vl) of the full vocabulary; targets: i32 [N] (full-vocabulary
// ids); every per-row tensor: f32 [N]. vocab_size as for the embedding: the full padded
// vocabulary, for the bounds check only (every target in [0, vocab_size), the shard
// inside it); 0 means unsharded (vocab_start must be 0, vocab_size = Vl).
//
// row_max[n] = max over the local columns of logits[n,:].
void cross_entropy_max(Tensor row_max, Tensor logits);
// Given the GLOBAL row_max: sum_exp[n] = sum over the local columns of
// exp(logits[n,:] - row_max[n]); target_logit[n] = logits[n, targets[n] - vocab_start]
// when the target is in this shard, else 0 (so the sum over ranks is the target's logit).
void cross_entropy_sums(Tensor sum_exp, Tensor target_logit, Tensor logits, Tensor targets, Tensor row_max,
                        int64_t vocab_start, int64_t vocab_size = 0);
// Given the GLOBAL sum_exp and target_logit: logsumexp = row_max + log(sum_exp);
// losses = logsumexp - target_logit. Keep logsumexp for the backward.
void cross_entropy_finish(Tensor losses, Tensor logsumexp, Tensor sum_exp, Tensor row_max, Tensor target_logit);
// dlogits[n,j] += (exp(logits[n,j] - logsumexp[n]) - [vocab_start + j == targets[n]]) * dlosses[n],
// one pass over the local columns; no communication. vocab_start has no default so that
// every call states its shard. With GradWrite::Assign dlogits may be logits itself (the
// same tensor: each element is read before it is overwritten), so the gradient takes the
// logits' memory and no [N,Vl] buffer is allocated or zeroed; the logits are gone after.
void cross_entropy_backward(Tensor dlogits, Tensor dlosses, Tensor logits, Tensor targets, Tensor logsumexp,
                            int64_t vocab_start, int64_t vocab_size = 0, GradWrite write = GradWrite::Accumulate);

// Sequence-parallel regrouping: pure permutations (no arithmetic, so no backward: the
// gradient of each is the other applied to the gradient), each the other's inverse.
// The sequence layout is [B,T,C]; the rank-major layout holds, for r = 0..parts-1, the
// block [B, T/parts, C] of rows t in [r*T/parts, (r+1)*T/parts), rank r's chunk
// contiguous: the buffer layout of an all-gather / reduce-scatter over `parts` ranks.
// inp/out: [B,T,C] on the sequence side; the rank-major side may have any shape with the
// same element count and dtype (any dtype). parts must divide T; out must not overlap inp.
void sequence_to_rank_major(Tensor out, Tensor inp, int parts);
void rank_major_to_sequence(Tensor out, Tensor inp, int parts);

// The masked language-model loss (Megatron's loss_func in pretrain_gpt.py: the sum of
// loss * mask and the token count, which the caller divides): sums: I64 [2] holding
// doubles; sums[0] += sum_i losses[i] * mask[i], sums[1] += sum_i mask[i], each summed in
// double in index order first. losses, mask: f32 of the same element count.
void masked_loss_sums(Tensor sums, Tensor losses, Tensor mask);
// The gradient of sum(losses * mask) * scale: dlosses[i] += mask[i] * scale.
void masked_loss_backward(Tensor dlosses, Tensor mask, float scale, GradWrite write = GradWrite::Accumulate);

// Where a parameter shard sits in its full tensor: local element e (row-major, rows of
// `cols` elements) is element first + (e / cols) * full_cols + e % cols of the full one.
// A shard of whole rows is {first row * row size, numel, numel}.
struct ShardIndex {
  int64_t first = 0;
  int64_t cols = 1;
  int64_t full_cols = 1;
};
// Megatron's normal initialisation: out[e] = std * a standard normal drawn by
// core/philox.h's tessera_philox_normal(seed, tensor_id, full index of e), so every
// backend and every parallel layout holds the same weights. A 16-bit out holds the f32
// draw rounded once.
void init_normal(Tensor out, float std, uint32_t seed, uint32_t tensor_id, ShardIndex where);
// out[:] = value, rounded once to out's dtype.
void fill(Tensor out, float value);
// out = inp converted to out's dtype: any of F32, BF16, F16 on either side, the same
// element count; each element widened exactly and rounded once to out's dtype
// (round-to-nearest-even; a half overflows to +-inf; NaN stays NaN). It copies the fp32
// main parameters back into the 16-bit parameters after each optimizer step. out may be
// inp only when the dtypes match (then nothing happens).
void convert(Tensor out, Tensor inp);

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

// Tensors of doubles: tessera has no f64 dtype, so these are I64 tensors whose 8-byte
// elements hold IEEE doubles (the host reads them back as double).
//
// sums[slot] += the sum of squares of t, in double (a partial of the global gradient
// norm). sums: I64 [S] holding doubles. The CPU's order (fixed chunks of 65536 elements,
// each in 32 double accumulators, then the accumulators and chunks in order) is the
// contract, so every backend gives the same bits. A step fills one slot per parameter
// and reads the buffer back once.
void sum_squares(Tensor sums, int64_t slot, Tensor t);
// t *= scale.
void scale_inplace(Tensor t, float scale);

}  // namespace tessera::ops
