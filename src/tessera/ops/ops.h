// The kernels of the GPT model, each an explicit forward and backward on Tensors,
// dispatched by the tensors' device to its backend's kernel table (kernel_table.h). The ops
// themselves, each with its contract and precision class, are listed once in ops.inc; this
// header holds the conventions they share and the types of their arguments, and makes each
// op a function object: ops::layernorm_forward(out, mean, rstd, inp, weight, bias, eps).
//
// Conventions, identical on every backend:
// - Arguments: outputs first, then inputs, then sizes and settings.
// - Every backward ACCUMULATES (+=) into its gradient outputs by default, parameters and
//   inputs alike, so gradient accumulation over micro-batches and the residual stream need
//   no extra adds. A backward whose input gradient is often a first contribution takes a
//   GradWrite last (op.h): Assign overwrites that gradient instead, so the caller needs no
//   zero fill first; a call may leave it out for Accumulate. Parameter gradients
//   accumulate, and callers zero them when a new accumulation starts, except the linears'
//   (linear_backward, linear_bias_gelu_backward), which take a second GradWrite for their
//   weight and bias gradients: the first micro-batch of a step assigns them instead. They
//   also take a GradSquares last: the last micro-batch adds its weight gradients' squares to
//   the gradient norm's slots as it writes them.
// - An empty Tensor (no handle: Tensor::empty()) for an optional input (bias) or gradient
//   output means "absent" / "not needed".
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
// - Precision: each op states its class (op.h: Exact, OrderFree, Product16) and its bound;
//   ops::fill.precision or precision_of("fill") (kernel_table.h) answers it.
//
// Shape legend: B batch, T sequence, C hidden, V padded vocabulary, Vl the vocabulary rows
// (columns of logits) of this tensor-parallel rank, NH heads (local to this rank), HD head
// dim, OC output channels, N rows (= B*T), P positions table size.
#pragma once

#include <cstdint>
#include <vector>

#include "tessera/core/rng.h"
#include "tessera/core/tensor.h"
#include "tessera/ops/op.h"

namespace tessera {
class Device;
}

namespace tessera::ops {

// Where a dropout's random draws come from. Element e of sample b is kept iff the Philox
// draw at counter {(element_offset+e)/4, sample0+b, key.site, key.iteration}, lane
// (element_offset+e)%4, is >= p; kept elements are scaled by 1/(1-p). element_offset
// places a shard (heads of a TP rank, rows of a sequence-parallel rank) inside the full
// per-sample tensor so every layout draws the same mask. p == 0 disables dropout.
// iteration, when present, is the iteration as a device scalar (I32 [1] on the op's device):
// the kernels read the counter's iteration from it instead of key.iteration, so the launches
// of a step do not change from step to step (a captured CUDA graph replays them while the
// host rewrites the scalar). It holds the value key.iteration would: the same mask.
struct Dropout {
  float p = 0.0f;
  DropoutKey key;
  uint32_t sample0 = 0;         // global index of the batch's first sample
  uint64_t element_offset = 0;  // offset of this shard inside one sample's full tensor
  Tensor iteration;             // I32 [1] on the device, or empty: key.iteration
};

// Throws unless d.iteration is empty or an I32 [1] tensor on `device` (every backend's
// dropout arguments check it).
void check_dropout_iteration(const Dropout& d, const Device& device);

// attention_buffers' answer: the shapes of attention's saved state and backward workspace,
// the backend's choice. Softmax probabilities [B,NH,T,T] are saved in the activations'
// dtype (Megatron's fused softmax keeps its output in the input's precision), a log-sum-exp
// [B,NH,T] in F32; the scratch is F32. Scores and softmax are computed in f32
// (--attention-softmax-in-fp32).
struct AttentionBuffers {
  Shape saved;
  DType saved_dtype = DType::F32;
  Shape scratch;
};

// Rotary position embedding (Megatron's --position-embedding-type rope, non-interleaved:
// megatron/core/models/common/embeddings/rope_utils.py), applied by attention_qkv_forward.
// Channels [0, dim) of each query and key head are rotated, channel j < dim/2 paired with
// j + dim/2, by the angle t * inv_freq[j mod dim/2] of the token's position t in the
// sequence (0..T-1: the batch's position ids are not used, as in Megatron), inv_freq[i] =
// 1 / base^(2i/dim), inv_freq and the angle computed in f32 as Megatron does (fp32 arange,
// pow, outer product); cos and sin of the f32 angle to f32 accuracy (the CPU rounds double
// ones; devices use their f32 cos, sin and pow, so backends agree to a few ulp of the
// angle, not bit for bit: PoCL within 4e-6 of the CPU at T = 4096). Channels [dim, HD) pass
// through. dim == 0: no rotation. With scaling, inv_freq is rope_inv_freq's.
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
// formula for the OpenCL and CUDA kernels. A plain function, not an op.
float rope_inv_freq(const Rope& rope, int64_t i);

// Where an attention operand's rows sit in the whole sequence, for attention over a sequence
// split across ranks (context parallelism: Megatron's get_batch_on_this_cp_rank gives a rank
// two chunks of the sequence, see model/context_parallel.h). Row t of a tensor of T rows is at
// position t < split ? first + t : second + (t - split); split == 0 means one run: first + t.
// Positions increase with t (first + split <= second), and the runs lie inside the sequence.
struct SequenceRows {
  int64_t split = 0;
  int64_t first = 0;
  int64_t second = 0;
  int64_t position(int64_t t) const { return split == 0 || t < split ? first + t : second + (t - split); }
};

// One block pair of the fused attention (flash_attention_*): the queries of qkv against the
// keys and values of kv, each tensor's rows at the positions its SequenceRows says, a key
// visible to a query when its position is not after the query's (causal over true positions:
// a diagonal block, a full one or an empty one as the positions fall). The default is the
// whole sequence in qkv attending to itself.
struct AttentionBlock {
  int64_t seq_length = 0;  // the whole sequence: dropout's element index and RoPE's positions (0: qkv's T)
  SequenceRows queries, keys;
  // Forward only: (out, lse) already hold the attention of these queries over other keys of
  // the sequence, which this call merges its keys into (the online softmax continued from
  // lse); false: they are written.
  bool merge = false;
};

enum class GeluKind { Tanh, Erf };  // Megatron: tanh with bias-gelu fusion / --openai-gelu, erf otherwise

// Where a parameter shard sits in its full tensor (init_normal): local element e
// (row-major, rows of `cols` elements) is element first + (e / cols) * full_cols + e % cols
// of the full one. A shard of whole rows is {first row * row size, numel, numel}.
struct ShardIndex {
  int64_t first = 0;
  int64_t cols = 1;
  int64_t full_cols = 1;
};

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

// The ops, from ops.inc: their numbers, their signatures (what each backend's kernel is
// declared with) and the function objects that dispatch them.
enum class OpId : int {
#define TESSERA_OP(name, precision, signature) name,
#include "tessera/ops/ops.inc"
};
inline constexpr int kOpCount = 0
#define TESSERA_OP(name, precision, signature) +1
#include "tessera/ops/ops.inc"
    ;

namespace signatures {
#define TESSERA_OP(name, precision, signature) using name = signature;
#include "tessera/ops/ops.inc"
}  // namespace signatures

#define TESSERA_OP(name, precision, signature) \
  inline constexpr Op<signatures::name> name{OpId::name, #name, Precision::precision};
#include "tessera/ops/ops.inc"

}  // namespace tessera::ops
