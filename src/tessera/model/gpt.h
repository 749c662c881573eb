// The GPT model of Megatron's pretrain_gpt (--transformer-impl local): this rank's share of
// it (model/model_partition.h: its pipeline chunks and tensor-parallel slices). Parameters
// and gradients live in one slab each; activations in a third, all allocated at
// construction (nothing in the step loop).
//
// Parameters and activations are in the config's params_dtype (16-bit with --bf16/--fp16,
// as Megatron's Float16Module keeps them), gradients of parameters in f32 (Megatron's
// main_grad: the linear layers accumulate into it directly), and the statistics Megatron
// computes in f32 (LayerNorm mean/rstd, the loss and its per-row sums) in f32.
//
// Activations are kept per micro-batch in flight, in two kinds of slots per chunk:
//  - an activation slot holds what backward needs from forward (Forward .. Backward);
//  - an I/O slot holds what crosses a pipeline boundary: the chunk's input (received, or the
//    embedding's output), its output (sent, or the final LayerNorm's input), the gradient of
//    its output (received) and of its input (sent). Its life runs from the receive of the
//    input to the send of the input gradient, a little longer than the activations'.
// The pipeline executor (train/) decides which slot a micro-batch uses.
//
// Shape legend: B micro-batch, S the sequence (--seq-length), T this rank's rows of it (S/CP
// with context parallelism: model/context_parallel.h), Tl = T/TP with --sequence-parallel (else T),
// C hidden, A attention width, F ffn hidden, V padded vocabulary; a trailing "l" means
// this TP rank's slice (Al = A/TP, Fl = F/TP, Vl = V/TP, NHl heads).
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "tessera/core/tensor.h"
#include "tessera/device/buffer.h"
#include "tessera/model/gpt_config.h"
#include "tessera/model/model_partition.h"
#include "tessera/model/moe_layer.h"
#include "tessera/parallel/grad_buffer_layout.h"
#include "tessera/parallel/tensor_parallel.h"

namespace tessera {

class Communicator;
class Device;

// One micro-batch: inputs, targets and the loss mask, as Megatron's get_batch returns them.
struct MicroBatch {
  Tensor tokens;     // i32 [B,T]
  Tensor positions;  // i32 [B,T]
  Tensor labels;     // i32 [B,T]
  Tensor loss_mask;  // f32 [B,T]
};

// Per-step randomness and identity: which iteration and which global samples this
// micro-batch holds (keys the dropout masks), and whether dropout is active.
struct StepContext {
  uint32_t iteration = 0;
  uint32_t first_sample = 0;  // index of the micro-batch's first sample in the global batch
  bool training = true;
  // The gradient scale of the MoE aux losses (Megatron's MoEAuxLossAutoScaler: the main
  // loss's scale over the micro-batches of the step).
  double moe_aux_scale = 1.0;
  // `iteration` as a device scalar (I32 [1], ops.h Dropout::iteration), which the dropout
  // kernels read instead; empty: they take `iteration` as an argument.
  Tensor iteration_scalar;
  // The step's last micro-batch: its backward writes each parameter gradient for the last
  // time before the optimizer (GPTModel::hand_grad_squares).
  bool last_micro_batch = false;
};

// Which slots of a chunk one micro-batch uses.
struct SlotRef {
  int act = 0;
  int io = 0;
};

// Bytes the model allocates, computed without allocating (memory estimate, tests).
struct GPTSlabSizes {
  size_t params = 0;       // in the config's params_dtype
  size_t grads = 0;        // f32
  size_t activations = 0;  // every slot and the shared workspaces
  int64_t num_parameters = 0;
};

class GPTModel {
 public:
  // The whole model on one rank, one micro-batch in flight.
  GPTModel(const GPTConfig& config, Device& device, int micro_batch_size);
  // This rank's share. act_slots[c] / io_slots[c]: slots of chunk c. tp: the tensor-parallel
  // group (null for TP 1), used for the region communication. buffer_layout: where each
  // parameter and its gradient sit in their slabs (data parallelism's buckets and the
  // distributed optimizer's ranges); null: buffer_layout_for(config, partition, {}).
  // cp: the context-parallel group when partition.cp_size > 1 (the attention's ring); ep: the
  // expert-parallel group when partition.ep_size > 1 (the MoE dispatcher's).
  GPTModel(const GPTConfig& config, Device& device, int micro_batch_size, const ModelPartition& partition,
           const std::vector<int>& act_slots, const std::vector<int>& io_slots, Communicator* tp,
           const GradBufferLayout* buffer_layout = nullptr, Communicator* cp = nullptr, Communicator* ep = nullptr);
  // The slab layout of these parameters (registration order) under data-parallel `options`;
  // with the distributed optimizer the tied embedding shared by two pipeline stages gets a
  // bucket of its own, so that both stages shard it alike.
  static GradBufferLayout buffer_layout_for(const GPTConfig& config, const ModelPartition& partition,
                                            const GradBufferOptions& options);
  ~GPTModel();

  // buffers: the parameter/gradient buffer's layout options (grad_buffer_layout's); device:
  // the backend whose attention_buffers size attention's saved state.
  static GPTSlabSizes slab_sizes(const GPTConfig& config, int micro_batch_size, const ModelPartition& partition,
                                 const std::vector<int>& act_slots, const std::vector<int>& io_slots,
                                 const GradBufferOptions& buffers, const Device& device);

  // Whether attention runs fused on `device` (ops.h flash_attention_*: no [B,NH,T,T] state):
  // when its backend has the op, unless it runs --deterministic-mode (the unfused ops, today's
  // bits) or the config's attention dropout is on where the backend's fused attention is not
  // its fast path with dropout (Backend::fused_attention_dropout: CUDA).
  static bool uses_fused_attention(const GPTConfig& config, const Device& device);
  // Whether the model runs ops.h's fused epilogue `op` (linear_bias_gelu_*,
  // bias_dropout_add_*) in place of the unfused ops on `device`: when its backend has it,
  // unless it runs --deterministic-mode.
  static bool uses_fused_epilogue(const Device& device, ops::OpId op);
  // Whether the loss's statistics take one pass (ops.h cross_entropy_stats) instead of
  // cross_entropy_max and _sums: when the vocabulary is unsharded (nothing crosses ranks
  // between the two) and the backend has it; the same bits, so in every mode.
  static bool uses_cross_entropy_stats(int tp_size, const Device& device);

  const GPTConfig& config() const { return config_; }
  const ModelPartition& partition() const { return partition_; }
  int num_chunks() const { return static_cast<int>(partition_.chunks.size()); }
  // This rank's parameters, in registration order, with where each sits in the full one.
  const std::vector<ParamShard>& shards() const { return shards_; }
  const std::vector<Tensor>& params() const { return params_; }
  const std::vector<Tensor>& grads() const { return grads_; }
  // The parameter and gradient slabs as flat tensors [buffer_layout().numel], and their layout.
  Tensor param_buffer() const;
  Tensor grad_buffer() const;
  const GradBufferLayout& buffer_layout() const { return buffer_layout_; }
  // By Megatron name (the first, if a tied copy shares it).
  const Tensor& param(const std::string& name) const;
  int64_t num_parameters() const;  // held by this rank
  size_t activation_bytes() const;

  // Megatron's initialisation (megatron/core/transformer/transformer_config.py): element e
  // of each full parameter drawn from the counter-based RNG keyed by (seed, parameter id, e),
  // so every layout holds slices of the same full weights.
  void init_weights();
  // Copies this rank's slices of full parameters, by Megatron name, rounded to the
  // parameters' dtype; every parameter must be present with its full shape.
  void load_weights(const std::map<std::string, std::vector<float>>& weights);
  // Starts a step's gradient accumulation: every gradient reads as zero to the step's first
  // backward of each chunk. In --deterministic-mode one fill of the slab; otherwise the fill
  // skips the linears' weight gradients that a chunk's first backward assigns
  // (first_write_gradients), so grads() hold their values only once every chunk ran a
  // backward.
  void zero_grads();
  // The gradients whose squares the backward can hand to the gradient norm as it writes them
  // (ops.h GradSquares): the layers' linear weights but an MoE layer's MLP, by shard index.
  std::vector<size_t> squarable_grads() const;
  // From now on a step's last micro-batch (StepContext::last_micro_batch) adds the sum of
  // squares of each squarable gradient i with slot_of_shard[i] >= 0 into sums[that slot] as
  // its backward writes it. The caller leaves those out of its own norm pass and zeroes
  // their slots before each step, and sees that nothing changes the gradients between the
  // backward and the norm (no data-parallel reduction).
  void hand_grad_squares(Tensor sums, const std::vector<int64_t>& slot_of_shard);

  // I/O tensors of a chunk's slot, [B,Tl,C]: the pipeline executor receives into input and
  // output_grad and sends output and input_grad.
  Tensor chunk_input(int chunk, int io_slot) const;
  Tensor chunk_output(int chunk, int io_slot) const;
  Tensor chunk_output_grad(int chunk, int io_slot) const;
  Tensor chunk_input_grad(int chunk, int io_slot) const;

  // Forward of one micro-batch through a chunk. A chunk with the embedding reads the batch's
  // tokens; others read chunk_input. A chunk with the head adds the sum of masked per-token
  // losses and the mask's sum into loss_sums (I64 [2] holding doubles on the model's device,
  // ops::masked_loss_sums; the caller divides); others leave their result in chunk_output
  // and loss_sums untouched. Nothing is read back to the host.
  void forward(int chunk, SlotRef slot, const MicroBatch& batch, const StepContext& step, Tensor loss_sums);
  // Called in forward with a range [first, end) of parameter indices just before they are
  // read (the distributed optimizer's overlapped parameter gather waits there).
  using ParamsNeeded = std::function<void(size_t first, size_t end)>;
  void set_params_needed(ParamsNeeded callback) { params_needed_ = std::move(callback); }
  // Called during backward with a range [first, end) of parameter indices whose gradients
  // this backward will not touch again (data parallelism starts reducing them).
  using GradsReady = std::function<void(size_t first, size_t end)>;
  // Backward of a chunk's micro-batch. With the head, the gradient of
  // sum(loss * mask) * loss_weight; otherwise the gradient arriving in chunk_output_grad.
  // Accumulates into grads(); a chunk without the embedding leaves dL/d input in
  // chunk_input_grad.
  void backward(int chunk, SlotRef slot, const MicroBatch& batch, const StepContext& step, float loss_weight,
                const GradsReady& grads_ready = nullptr);

  // The whole model's single-slot forward/backward (chunk 0, slot 0). This forward returns
  // the masked loss sum, read back at once (tests and tools; training reads once a step).
  double forward(const MicroBatch& batch, const StepContext& step);
  void backward(const MicroBatch& batch, const StepContext& step, float loss_weight,
                const GradsReady& grads_ready = nullptr) {
    backward(0, {}, batch, step, loss_weight, grads_ready);
  }
  // The last forward's logits in slot 0 of the head chunk: [B,T,Vl]. The backward overwrites
  // them with their gradient (cross_entropy_backward in place).
  Tensor logits() const;

  // The MoE layers' load-balancing and z losses (each divided by its coefficient) summed over
  // the training forwards since the last take, per layer of the whole model (zeros for the
  // layers this rank does not hold): Megatron's aux-loss tracker.
  MoELossTracker take_moe_losses();

 private:
  struct Layout;
  struct LayerParams {
    Tensor ln1_w, ln1_b, qkv_w, qkv_b, proj_w, proj_b, ln2_w, ln2_b, fc1_w, fc1_b, fc2_w, fc2_b;
    MoEParams moe;  // an MoE layer's MLP (router, experts, shared experts)
  };
  struct LayerActs;
  struct HeadActs;
  struct ActSlot;
  struct IoSlot;
  struct Workspace;
  struct Chunk;

  struct LayerIo {
    LayerActs* acts;
    Tensor in, out;
  };
  LayerIo layer_io(Chunk& ch, ActSlot& acts, IoSlot& io, int chunk_layer);
  LayerParams layer_tensors(const std::vector<Tensor>& all, size_t first, size_t end) const;
  ops::Dropout dropout(float p, int site, const StepContext& step, uint64_t element_offset) const;
  void norm_in_forward(Tensor ln, Tensor ln_whole, Tensor mean, Tensor rstd, Tensor in, Tensor weight, Tensor bias);
  void norm_in_backward(Tensor in, Tensor weight, Tensor d_weight, Tensor d_bias, Tensor mean, Tensor rstd,
                        ops::GradWrite write = ops::GradWrite::Accumulate);
  void row_out_forward(Tensor out, Tensor residual, Tensor inp, Tensor weight, Tensor bias, const ops::Dropout& drop);
  void row_out_backward(Tensor d_inp, Tensor inp, Tensor weight, Tensor d_weight, Tensor d_bias,
                        const ops::Dropout& drop, ops::GradWrite param_write, const ops::GradSquares& squares);
  void branch_out_forward(Tensor out, Tensor residual, Tensor bias, const ops::Dropout& drop);
  void branch_out_backward(Tensor d_bias, const ops::Dropout& drop);
  void mlp_forward(int layer, const LayerParams& w, LayerActs& a, Tensor out, const StepContext& step);
  void mlp_backward(int layer, const LayerParams& w, const LayerParams& g, LayerActs& a, const StepContext& step,
                    ops::GradWrite param_write);
  void layer_forward(int layer, const LayerParams& w, LayerActs& a, Tensor in, Tensor out, const StepContext& step);
  void layer_backward(int layer, const LayerParams& w, const LayerParams& g, LayerActs& a, Tensor in,
                      const StepContext& step, ops::GradWrite param_write);
  ops::Dropout attention_dropout(int layer, const StepContext& step) const;
  // Where the backward of `step` adds grad's squares (hand_grad_squares), or nowhere.
  ops::GradSquares squares_of(const Tensor& grad, const StepContext& step) const;
  // A dropout over [B,rows,width] activations holding rows [first_row, first_row + rows) of
  // this rank's T, in pieces of consecutive sequence positions (one piece without context
  // parallelism or without dropout): each piece's tensors are piece_of's views.
  struct DropPiece {
    int64_t b = -1, row = 0, rows = 0;  // b -1: the whole tensor
    ops::Dropout dropout;
  };
  std::vector<DropPiece> drop_pieces(const ops::Dropout& drop, int64_t B, int64_t rows, int64_t first_row,
                                     int64_t width) const;
  static Tensor piece_of(const Tensor& t, const DropPiece& p);
  // The pieces of a hidden dropout (after a row-parallel linear: this TP rank's Tl rows).
  std::vector<DropPiece> hidden_drop_pieces(const ops::Dropout& drop) const {
    return drop_pieces(drop, micro_batch_, tp_.local_seq(seq_), tp_.seq_offset(seq_), config_.hidden_size);
  }
  // The all-gather staging for a whole-sequence tensor like `whole`.
  Tensor cp_staging(const Tensor& whole) const;
  void attention_forward(int layer, LayerActs& a, const StepContext& step);
  Tensor attention_heads(Tensor qkv);
  void attention_backward(int layer, LayerActs& a, const StepContext& step);
  void embedding_forward(Tensor out, const MicroBatch& batch, const StepContext& step);
  void need_params(size_t first, size_t end) const {
    if (params_needed_ && first < end) params_needed_(first, end);
  }
  void embedding_backward(const MicroBatch& batch, const StepContext& step);
  void head_forward(const Chunk& c, HeadActs& h, Tensor in, const MicroBatch& batch, Tensor loss_sums);
  void head_backward(const Chunk& c, HeadActs& h, Tensor in, const MicroBatch& batch, float loss_weight,
                     ops::GradWrite param_write);
  // The gradients a chunk's backward writes first with linear_backward or
  // linear_bias_gelu_backward (their param_write), before any other op adds to them.
  std::vector<Tensor> first_write_gradients(const Chunk& c) const;
  // The byte ranges of the gradient slab outside every chunk's first_write_gradients, merged.
  std::vector<std::pair<size_t, size_t>> grad_fill_ranges() const;
  // How chunk's backward writes its first_write_gradients: Assign when it is the chunk's first
  // backward since a default-mode zero_grads.
  ops::GradWrite take_param_write(int chunk);

  GPTConfig config_;
  Device& device_;
  int micro_batch_;
  ModelPartition partition_;
  std::vector<ParamShard> shards_;
  GradBufferLayout buffer_layout_;
  Buffer params_slab_, grads_slab_, acts_slab_;
  ParamsNeeded params_needed_;
  std::vector<Tensor> params_, grads_;
  std::map<std::string, size_t> index_;
  std::vector<Chunk> chunks_;
  std::unique_ptr<Workspace> ws_;
  TensorParallelRegion tp_;
  int64_t vocab_start_ = 0;  // first vocabulary row of this TP rank
  int64_t head_start_ = 0;   // first attention head of this TP rank
  Communicator* cp_ = nullptr;  // the context-parallel group (null: CP 1)
  int64_t seq_ = 0;             // T: this rank's rows of the sequence
  bool fused_attention_ = false;  // ops::flash_attention_* (else the unfused attention ops)
  std::unique_ptr<MoELayer> moe_;  // with MoE layers
  MoELossTracker moe_losses_;
  std::vector<std::pair<size_t, size_t>> grad_fill_;  // grad_fill_ranges(), planned once
  std::vector<bool> assign_pending_;  // per chunk: no backward since a default-mode zero_grads
  // hand_grad_squares: the norm's slots, and the slot of each handed gradient by its memory.
  Tensor squares_sums_;
  std::map<std::pair<void*, size_t>, int64_t> squares_slot_;
};

}  // namespace tessera
