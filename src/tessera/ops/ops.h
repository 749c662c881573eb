// The kernels of the GPT model, each an explicit forward and backward on Tensors,
// dispatched by the tensors' device to its backend's kernel table (kernel_table.h).
//
// Conventions, identical on every backend:
// - Arguments: outputs first, then inputs, then sizes and settings.
// - Every backward ACCUMULATES (+=) into every gradient output, parameters and inputs
//   alike, so gradient accumulation over micro-batches and the residual stream need no
//   extra adds. Callers zero gradient buffers when a new accumulation starts.
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
#include <vector>

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
void layernorm_backward(Tensor dinp, Tensor dweight, Tensor dbias, Tensor dout, Tensor inp, Tensor weight,
                        Tensor mean, Tensor rstd);

// RMSNorm over the last dim (Megatron's --normalization RMSNorm, torch.nn.RMSNorm):
// out = inp * rstd * weight, rstd = 1/sqrt(mean(inp^2) + eps), computed in f32 and rounded
// once. inp, out: [N,C]; weight: [C]; saves rstd: f32 [N].
void rmsnorm_forward(Tensor out, Tensor rstd, Tensor inp, Tensor weight, float eps);
void rmsnorm_backward(Tensor dinp, Tensor dweight, Tensor dout, Tensor inp, Tensor weight, Tensor rstd);

// out[N,OC] = inp[N,C] @ weight[OC,C]^T + bias[OC] (Megatron's [out, in] weight layout).
// backward: dinp += dout @ weight, dweight += dout^T @ inp, dbias += column sums of dout
// (the same reduction as bias_add_backward).
// Dtypes: any float dtype each (Megatron's --bf16 / --fp16 keep inp, weight, out and dinp
// in bf16 / f16); dweight and dbias are typically F32 (fp32 main grads:
// Megatron's gradient-accumulation fusion adds weight gradients straight into them). The
// products follow the operand dtypes (bf16 and f16 values are exact in f32, so a 16-bit
// GEMM with f32 accumulation is the same arithmetic as an f32 GEMM of the widened
// operands); each result is rounded once into out, or added into its gradient and rounded
// once.
void linear_forward(Tensor out, Tensor inp, Tensor weight, Tensor bias);
void linear_backward(Tensor dinp, Tensor dweight, Tensor dbias, Tensor dout, Tensor inp, Tensor weight);

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

// SwiGLU (Megatron's --swiglu: megatron/core/transformer/mlp.py glu): inp: [N,2F], each
// row [gate | up] (this tensor-parallel rank's halves); out: [N,F] = silu(gate) * up,
// silu(x) = x / (1 + exp(-x)), in f32, rounded once. out must not overlap inp (nor dinp
// dout).
void swiglu_forward(Tensor out, Tensor inp);
void swiglu_backward(Tensor dinp, Tensor dout, Tensor inp);

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
// every call states its shard.
void cross_entropy_backward(Tensor dlogits, Tensor dlosses, Tensor logits, Tensor targets, Tensor logsumexp,
                            int64_t vocab_start, int64_t vocab_size = 0);

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
void masked_loss_backward(Tensor dlosses, Tensor mask, float scale);

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

// ---- The multi-tensor optimizer step (Megatron's multi_tensor_apply: Apex FusedAdam,
// multi_tensor_l2norm, multi_tensor_scale) ----
// One call runs over every parameter of a slab (the optimizer's parameters, or the pieces a
// data-parallel rank owns with the distributed optimizer) instead of one call per tensor.
// The slabs are flat tensors (main: the F32 main parameters; param: the 16-bit parameters,
// or empty when they are F32 and so their own main values; grad: F32 gradients; m, v,
// momentum_buf: F32 state), and a chunk table says where each segment (a parameter or an
// owned piece) sits in each of them: I64 [C, kChunkColumns], one row per chunk of at most
// kMultiTensorChunk elements of a segment, in segment order (multi_tensor_chunk_table
// builds it on the host once; the caller uploads it). Chunks are sum_squares' 65536-element
// chunks, so the norm keeps its order.
constexpr int64_t kMultiTensorChunk = 65536;
enum ChunkColumn : int64_t {
  kChunkMain,      // element offset of the chunk in main
  kChunkParam,     // ... in param (the 16-bit copy; unused when param is empty)
  kChunkGrad,      // ... in grad
  kChunkState,     // ... in m, v or momentum_buf
  kChunkNumel,     // elements in the chunk (1..kMultiTensorChunk)
  kChunkDecay,     // 1: weight decay applies (Megatron's wd_mult); 0: the no-decay group (biases, norms)
  kChunkSlot,      // the sums slot of the chunk's segment (multi_tensor_sum_squares)
  kChunkSegment,   // on a segment's first chunk, its number of chunks; 0 on the others
  kChunkColumns
};
struct MultiTensorSegment {
  int64_t main = 0, param = 0, grad = 0, state = 0;  // element offsets of the segment's start
  int64_t numel = 0;
  bool decay = true;
  int64_t slot = 0;
};
// The chunk table of `segments` (row-major, C * kChunkColumns values); empty segments take
// no row.
std::vector<int64_t> multi_tensor_chunk_table(const std::vector<MultiTensorSegment>& segments);

// The step's scalars live in device memory, F32 [kStepScalars], so that the multi-tensor
// ops read them there instead of taking them as launch arguments (a step whose launches do
// not change can be captured and replayed). The host writes [0, kGradScale) once per step
// (write_step_scalars' values: one host-to-device copy); grad_norm_finish writes kGradScale
// on the device from the norm.
enum StepScalar : int64_t {
  kLossScale,    // the loss scale (1 without fp16's scaler)
  kLr,           // float(lr)
  kWeightDecay,  // float(weight decay)
  kAdamDecay,    // float(1 - lr * wd), in double: torch's param.mul_(1 - lr * wd)
  kAdamStepSize, // float(lr / (1 - beta1^t)), in double
  kAdamBc2Sqrt,  // float(sqrt(1 - beta2^t)), in double
  kSgdFirst,     // 1 on step 1 (torch's momentum buffer starts as the gradient), else 0
  kGradScale,    // the factor every gradient is read with: clip coefficient / loss scale
  kStepScalars
};
// The host-written scalars [0, kGradScale) of step t (1-based) of AdamW or SGD, computed as
// adamw_update and sgd_update compute theirs (so the multi-tensor ops give their bits).
void step_scalars(float out[kGradScale], double lr, double weight_decay, double loss_scale, float beta1,
                  float beta2, int64_t step);

// AdamW over a slab: for every chunk, adamw_update's arithmetic per element (the same bits:
// Precision: Exact) on main[kChunkMain..], m and v[kChunkState..], reading grad[kChunkGrad..]
// times scalars[kGradScale], with scalars' lr terms and weight decay only where kChunkDecay
// is 1; then, in the same pass, param[kChunkParam..] = the updated main value rounded once to
// param's dtype (ops.h convert: the bits of a following convert). main, m, v, grad: F32;
// param: BF16, F16 or empty; scalars: F32 [kStepScalars]. beta1, beta2 and eps are the run's
// constants.
void multi_tensor_adamw(Tensor main, Tensor param, Tensor grad, Tensor m, Tensor v, Tensor chunks, Tensor scalars,
                        float beta1, float beta2, float eps);
// SGD over a slab: sgd_update's arithmetic per element (Precision: Exact) with lr, weight
// decay (kChunkDecay 0: none) and the first-step flag from scalars; momentum == 0 keeps no
// buffer (momentum_buf may be empty). The 16-bit copy as for multi_tensor_adamw.
void multi_tensor_sgd(Tensor main, Tensor param, Tensor grad, Tensor momentum_buf, Tensor chunks, Tensor scalars,
                      float momentum);
// sums[kChunkSlot] += the sum of squares of each segment of grad (F32), in double: for every
// segment, exactly sum_squares(sums, slot, segment) (its chunks, lanes and order, so the
// same bits; Precision: Exact, which is within n * 2^-53 of the float64 sum of n squares
// relative to the sum, as any order is). Segments add into distinct slots. workspace: I64
// of multi_tensor_sum_squares_workspace's shape for the table's C chunks (no meaning
// outside the call): the caller allocates it once, so the call allocates nothing.
void multi_tensor_sum_squares(Tensor sums, Tensor workspace, Tensor grad, Tensor chunks);
Shape multi_tensor_sum_squares_workspace(const Device& device, int64_t chunks);
// The end of the gradient norm, on the device: total = the slots of sums (I64 [S] holding
// doubles, summed in slot order), norm = sqrt(total) / scalars[kLossScale]; result (I64 [2]
// holding doubles) = {norm, 1 if total is inf or NaN (Megatron's found_inf) else 0}; and
// scalars[kGradScale] = float(c / loss scale) with Megatron's clip coefficient c =
// min(clip_grad / (norm + 1e-6), 1) (1 when clip_grad <= 0 or the quotient is NaN), each
// step in double as the host computed it (Optimizer::clip_coefficient): Precision: Exact.
void grad_norm_finish(Tensor result, Tensor scalars, Tensor sums, float clip_grad);

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
