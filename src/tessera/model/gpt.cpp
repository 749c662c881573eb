#include "tessera/model/gpt.h"

#include <algorithm>
#include <cmath>
#include <string_view>

#include "tessera/core/error.h"
#include "tessera/device/backend.h"
#include "tessera/device/device.h"
#include "tessera/model/context_parallel.h"
#include "tessera/ops/kernel_table.h"
#include "tessera/ops/ops.h"

namespace tessera {
namespace {

// Dropout sites: 0 is the embedding; each layer has three (attention probabilities, after
// the attention projection, after the MLP). Part of the RNG key, so fixed forever.
constexpr int kEmbeddingSite = 0;
constexpr int kSitesPerLayer = 3;
int layer_site(int layer, int which) { return 1 + layer * kSitesPerLayer + which; }
enum LayerSite { kAttentionProbs = 0, kAfterAttention = 1, kAfterMlp = 2 };

constexpr ops::GradWrite kAssign = ops::GradWrite::Assign;


// Layers (chunk-local) in groups [first, end); a recomputed group keeps only its input and
// output per slot and reruns its forward in backward (--recompute-granularity full).
struct LayerGroup {
  int first, end;
  bool recomputed;
};

}  // namespace

struct GPTModel::LayerActs {
  // [B,Tl,C], [B,T,C] (= ln1 without SP), [B,Tl], [B,Tl]; mean only with LayerNorm
  Tensor ln1, ln1_whole, ln1_mean, ln1_rstd;
  Tensor qkv;                                 // [B,T,QKVl] Megatron's grouped layout
  // attention's saved state: the fused attention's log-sum-exp f32 [B,NHl,T], or the unfused
  // ops' (ops::attention_buffers: the probabilities [B,NHl,T,T] on the CPU and OpenCL)
  Tensor att;
  Tensor ctx;                                 // [B,T,Al]
  Tensor residual_mid;                        // [B,Tl,C] after attention + residual
  Tensor ln2, ln2_whole, ln2_mean, ln2_rstd;
  Tensor fc1, act;                            // [B,T,Fl2] before and [B,T,Fl] after GELU / SwiGLU
  std::unique_ptr<MoEActs> moe;               // an MoE layer's MLP state in place of fc1, act
  Tensor out;  // [B,Tl,C] the next layer's input; empty for the chunk's last layer (I/O output)
};

struct GPTModel::HeadActs {
  Tensor lnf, lnf_whole, lnf_mean, lnf_rstd;  // as ln1
  Tensor logits;                              // [B,T,Vl]
  Tensor losses, logsumexp;                   // [B,T]
};

struct GPTModel::ActSlot {
  std::vector<LayerActs> layers;
  HeadActs head;
};

struct GPTModel::IoSlot {
  Tensor input, output, output_grad, input_grad;  // [B,Tl,C]; the grads only where they cross stages
};

// Shared by every slot: written and consumed within one forward or backward call.
struct GPTModel::Workspace {
  Tensor partial;   // [B,T,C] a row-parallel output before reduction; the whole embedding under SP
  Tensor reduced;   // [B,Tl,C] its reduced slice (= partial without SP)
  Tensor pos_emb;   // [B,T,C] position embeddings
  Tensor row_max;   // [B*T]
  Tensor ce_sums;   // [2,B*T] per-row sum(exp) and target logit, reduced together
  Tensor d_residual, d_C, d_ln;      // [B,Tl,C]
  Tensor d_C_whole, d_ln_whole;      // [B,T,C] (= d_C, d_ln without SP)
  Tensor d_ctx, d_qkv, d_F, d_act, d_losses;  // the logits' gradient takes the logits' memory
  Tensor d_att;  // attention's backward workspace (ops::flash_attention_scratch or attention_buffers')
  // The unfused path's attention_qkv per-head [q;k;v] (RoPE applied, groups expanded) and its
  // gradient, [B,T,3Al]: rebuilt from the kept qkv in backward. The qkv tensors themselves when
  // the model has neither RoPE nor query groups (GPT: Megatron's layout is already per head).
  Tensor heads, d_heads;
  Tensor loss_sums;  // I64 [2] of doubles: the single-slot forward's masked loss and mask sums
  // Recomputation: the unfused attention state of one layer (selective), the activations of
  // one recomputed group of layers (full).
  Tensor att;
  std::vector<LayerActs> recomputed;
  // Context parallelism: the fused attention's ring buffers (context_parallel.h); the unfused path's
  // whole-sequence tensors [B,S,QKVl] / [B,S,Al] and the all-gather's staging.
  RingBuffers ring;
  Tensor qkv_whole, ctx_whole, d_ctx_whole, d_qkv_whole, cp_staging;
  MoEWorkspace moe;
};

struct GPTModel::Chunk {
  ModelChunk range;
  size_t first_param = 0, layers_first_param = 0, layers_end_param = 0, end_param = 0;
  std::vector<LayerParams> w, g;
  std::vector<std::pair<size_t, size_t>> layer_ranges;
  // Parameter indices; kAbsent for a parameter the model does not have (no position
  // embedding with RoPE, no final LayerNorm bias with RMSNorm).
  size_t wte = 0, wpe = 0, lnf_w = 0, lnf_b = 0, output_w = 0;
  std::vector<ActSlot> acts;
  std::vector<IoSlot> io;
  std::vector<LayerGroup> groups;
  std::vector<int> group_of;  // chunk-local layer -> group
};

namespace {

constexpr size_t kAbsent = SIZE_MAX;
Tensor param_or_empty(const std::vector<Tensor>& all, size_t i) { return i == kAbsent ? Tensor() : all[i]; }

std::vector<LayerGroup> recompute_groups(const GPTConfig& c, int n_layers) {
  std::vector<LayerGroup> groups;
  const int n = std::min(c.recompute_num_layers, n_layers);
  for (int l = 0; l < n_layers;) {
    if (c.recompute != Recompute::Full) {
      groups.push_back({l, l + 1, false});
      ++l;
    } else if (c.recompute_method == RecomputeMethod::Uniform) {
      groups.push_back({l, std::min(l + n, n_layers), true});
      l = groups.back().end;
    } else {
      groups.push_back({l, l + 1, l < n});
      ++l;
    }
  }
  return groups;
}

}  // namespace

// Where every activation tensor goes: reserves them in a SlabBuilder and records which
// Tensor each offset binds to. Both the constructor and slab_sizes run it, so the estimate
// is the allocation.
struct GPTModel::Layout {
  struct Pending {
    Tensor* t;
    DType dtype;
    Shape shape;
    size_t offset;
  };
  SlabBuilder builder;
  std::vector<Pending> pending;

  void reserve(Tensor& t, Shape shape, DType dtype) {
    pending.push_back({&t, dtype, shape, builder.reserve(dtype, shape)});
  }
  // An activation or its gradient: in the model's dtype.
  void reserve(Tensor& t, Shape shape) { reserve(t, std::move(shape), act); }
  // What Megatron keeps in f32 whatever the model's dtype (norm statistics, the loss).
  void reserve_f32(Tensor& t, Shape shape) { reserve(t, std::move(shape), DType::F32); }
  // With sequence parallelism a whole-sequence copy, else the same tensor (bound later).
  void reserve_whole(Tensor& whole, Shape shape) {
    if (sp) reserve(whole, std::move(shape));
  }

  // Everything a layer's backward reads; `out` (its output) separately. Selective
  // recomputation keeps the unfused attention's probabilities in one shared buffer instead
  // (the fused attention's log-sum-exp is as small as a norm's statistics: always kept).
  void reserve_layer(LayerActs& a, bool with_out, bool moe_layer) {
    reserve(a.ln1, {B, Tl, C});
    reserve_whole(a.ln1_whole, {B, T, C});
    if (layernorm) reserve_f32(a.ln1_mean, {B, Tl});
    reserve_f32(a.ln1_rstd, {B, Tl});
    reserve(a.qkv, {B, T, QKVl});
    if (fused) reserve_f32(a.att, {B, NHl, T});
    else if (!selective) reserve(a.att, att_buffers.saved, att_buffers.saved_dtype);
    reserve(a.ctx, {B, T, Al});
    reserve(a.residual_mid, {B, Tl, C});
    reserve(a.ln2, {B, Tl, C});
    reserve_whole(a.ln2_whole, {B, T, C});
    if (layernorm) reserve_f32(a.ln2_mean, {B, Tl});
    reserve_f32(a.ln2_rstd, {B, Tl});
    if (moe_layer) {
      a.moe = std::make_unique<MoEActs>();
      reserve_moe_acts(*a.moe, moe, reserve_any());
    } else {
      reserve(a.fc1, {B, T, Fl2});
      reserve(a.act, {B, T, Fl});
    }
    if (with_out) reserve(a.out, {B, Tl, C});
  }

  ReserveTensor reserve_any() {
    return [this](Tensor& t, Shape shape, DType dtype) { reserve(t, std::move(shape), dtype); };
  }

  bool sp = false, selective = false, layernorm = true, regroup = false, fused = false;
  MoEDims moe;
  DType act = DType::F32;
  int cp = 1;
  int64_t B = 0, S = 0, T = 0, C = 0, Tl = 0, Al = 0, QKVl = 0, KVl = 0, Fl = 0, Fl2 = 0, Vl = 0, NHl = 0;
  int64_t Ta = 0;  // the attention ops' sequence: T, or S where context parallelism gathers it (unfused)
  ops::AttentionBuffers att_buffers;  // the unfused attention's, sized by the device's backend

  Layout(const Device& device, const GPTConfig& c, int micro_batch, const ModelPartition& part,
         const std::vector<int>& act_slots, const std::vector<int>& io_slots, std::vector<Chunk>& chunks,
         Workspace& ws) {
    const int tp = part.tp_size;
    sp = part.sequence_parallel && tp > 1;
    selective = c.recompute == Recompute::Selective;
    act = c.params_dtype;
    cp = part.cp_size;
    B = micro_batch, S = c.seq_length, T = S / cp, C = c.hidden_size, Tl = sp ? T / tp : T;
    layernorm = c.normalization == Normalization::LayerNorm;
    regroup = c.regroups_qkv();
    Al = c.attention_width() / tp, QKVl = c.qkv_width() / tp, Fl = c.ffn_hidden_size / tp;
    KVl = int64_t{2} * c.query_groups() / tp * c.kv_channels;  // a row's keys and values
    Fl2 = c.swiglu ? 2 * Fl : Fl, Vl = c.padded_vocab_size / tp;
    NHl = c.num_attention_heads / tp;
    fused = uses_fused_attention(c, device);
    Ta = cp > 1 && !fused ? S : T;
    if (!fused) att_buffers = ops::attention_buffers(device, B, NHl, Ta, act);
    if (c.moe.enabled()) {
      moe = moe_dims(c, B, T, tp, sp, part.ep_size, part.ep_rank);
      moe.per_source_runs = part.ep_size > 1 && device.deterministic_mode();
    }
    int max_recomputed = 0;
    TESSERA_CHECK(act_slots.size() == part.chunks.size() && io_slots.size() == part.chunks.size(),
                  "one slot count per chunk");
    chunks.resize(part.chunks.size());
    bool any_embedding = false, any_head = false;
    for (size_t ci = 0; ci < chunks.size(); ++ci) {
      Chunk& ch = chunks[ci];
      ch.range = part.chunks[ci];
      any_embedding |= ch.range.has_embedding;
      any_head |= ch.range.has_head;
      const int n_layers = ch.range.end_layer - ch.range.first_layer;
      ch.groups = recompute_groups(c, n_layers);
      for (size_t g = 0; g < ch.groups.size(); ++g)
        for (int l = ch.groups[g].first; l < ch.groups[g].end; ++l) {
          ch.group_of.push_back(static_cast<int>(g));
          if (ch.groups[g].recomputed) max_recomputed = std::max(max_recomputed, ch.groups[g].end - ch.groups[g].first);
        }
      ch.acts.resize(act_slots[ci]);
      for (ActSlot& s : ch.acts) {
        s.layers.resize(n_layers);
        for (int l = 0; l < n_layers; ++l) {
          const LayerGroup& g = ch.groups[ch.group_of[l]];
          // A group's output is the next group's input: kept even when the group is recomputed.
          if (l + 1 == g.end && l + 1 < n_layers) reserve(s.layers[l].out, {B, Tl, C});
          if (!g.recomputed) reserve_layer(s.layers[l], false, c.moe.is_moe_layer(ch.range.first_layer + l));
        }
        if (ch.range.has_head) {
          HeadActs& h = s.head;
          reserve(h.lnf, {B, Tl, C});
          reserve_whole(h.lnf_whole, {B, T, C});
          if (layernorm) reserve_f32(h.lnf_mean, {B, Tl});
          reserve_f32(h.lnf_rstd, {B, Tl});
          reserve(h.logits, {B, T, Vl});
          reserve_f32(h.losses, {B, T});
          reserve_f32(h.logsumexp, {B, T});
        }
      }
      ch.io.resize(io_slots[ci]);
      for (IoSlot& io : ch.io) {
        reserve(io.input, {B, Tl, C});
        reserve(io.output, {B, Tl, C});
        if (!ch.range.has_head) reserve(io.output_grad, {B, Tl, C});
        if (!ch.range.has_embedding) reserve(io.input_grad, {B, Tl, C});
      }
    }
    reserve(ws.partial, {B, T, C});
    if (sp) reserve(ws.reduced, {B, Tl, C});
    if (selective && !fused) reserve(ws.att, att_buffers.saved, att_buffers.saved_dtype);
    ws.recomputed.resize(max_recomputed);
    TESSERA_CHECK(max_recomputed == 0 || !c.moe.enabled(), "full recomputation of MoE layers");
    for (LayerActs& a : ws.recomputed) reserve_layer(a, true, false);
    if (c.moe.enabled()) reserve_moe_workspace(ws.moe, moe, reserve_any());
    if (any_embedding && c.position_embedding == PositionEmbedding::LearnedAbsolute) reserve(ws.pos_emb, {B, T, C});
    if (any_head) {
      reserve_f32(ws.row_max, {B * T});
      reserve_f32(ws.ce_sums, {2, B * T});
      reserve_f32(ws.d_losses, {B, T});
      reserve(ws.loss_sums, {2}, DType::I64);
    }
    reserve(ws.d_residual, {B, Tl, C});
    reserve(ws.d_C, {B, Tl, C});
    reserve(ws.d_ln, {B, Tl, C});
    reserve_whole(ws.d_C_whole, {B, T, C});
    reserve_whole(ws.d_ln_whole, {B, T, C});
    reserve(ws.d_ctx, {B, T, Al});
    reserve(ws.d_qkv, {B, T, QKVl});
    if (regroup && !fused) {
      reserve(ws.heads, {B, Ta, 3 * Al});
      reserve(ws.d_heads, {B, Ta, 3 * Al});
    }
    reserve_f32(ws.d_att, fused ? ops::flash_attention_scratch(device, B, NHl, T) : att_buffers.scratch);
    reserve(ws.d_F, {B, T, Fl2});
    reserve(ws.d_act, {B, T, Fl});
    if (cp > 1) reserve_context_parallel(ws);
  }

  void reserve_context_parallel(Workspace& ws) {
    if (fused) {
      for (Tensor& m : ws.ring.message) reserve(m, {2, B, T, KVl});
      reserve(ws.ring.kv, {B, T, QKVl});
      reserve(ws.ring.dkv, {B, T, QKVl});
      return;
    }
    reserve(ws.qkv_whole, {B, S, QKVl});
    reserve(ws.ctx_whole, {B, S, Al});
    reserve(ws.d_ctx_whole, {B, S, Al});
    reserve(ws.d_qkv_whole, {B, S, QKVl});
    reserve(ws.cp_staging, {B * S * std::max(QKVl, Al)});
  }

  // Binds every reserved tensor into the slab, then the whole-sequence aliases.
  void bind(const Buffer& slab, std::vector<Chunk>& chunks, Workspace& ws) {
    for (Pending& p : pending) *p.t = tensor_at(slab, p.offset, p.dtype, p.shape);
    auto alias = [&](LayerActs& a) {
      if (selective && !fused) a.att = ws.att;
      if (!sp) a.ln1_whole = a.ln1, a.ln2_whole = a.ln2;
    };
    for (LayerActs& a : ws.recomputed) alias(a);
    for (Chunk& ch : chunks)
      for (ActSlot& s : ch.acts) {
        for (LayerActs& a : s.layers) alias(a);
        if (!sp) s.head.lnf_whole = s.head.lnf;
      }
    if (!regroup) ws.d_heads = cp > 1 && !fused ? ws.d_qkv_whole : ws.d_qkv;
    if (sp) return;
    ws.reduced = ws.partial;
    ws.d_C_whole = ws.d_C;
    ws.d_ln_whole = ws.d_ln;
  }
};

GPTModel::GPTModel(const GPTConfig& config, Device& device, int micro_batch_size)
    : GPTModel(config, device, micro_batch_size, ModelPartition::whole(config), {1}, {1}, nullptr) {}

GPTModel::~GPTModel() = default;

bool GPTModel::uses_fused_attention(const GPTConfig& config, const Device& device) {
  if (device.deterministic_mode() || !ops::supports(device, "flash_attention_forward")) return false;
  return config.attention_dropout == 0.0f || device.backend().fused_attention_dropout;
}

bool GPTModel::uses_fused_epilogue(const Device& device, ops::OpId op) {
  return !device.deterministic_mode() && ops::supports(device, op);
}

bool GPTModel::uses_cross_entropy_stats(int tp_size, const Device& device) {
  return tp_size == 1 && ops::supports(device, ops::cross_entropy_stats);
}

GPTSlabSizes GPTModel::slab_sizes(const GPTConfig& config, int micro_batch_size, const ModelPartition& partition,
                                  const std::vector<int>& act_slots, const std::vector<int>& io_slots,
                                  const GradBufferOptions& buffers, const Device& device) {
  GPTSlabSizes sizes;
  for (const ParamShard& s : shard_params(config, partition)) sizes.num_parameters += s.numel();
  const size_t numel = static_cast<size_t>(buffer_layout_for(config, partition, buffers).numel);
  sizes.params = numel * dtype_size(config.params_dtype);
  sizes.grads = numel * sizeof(float);
  std::vector<Chunk> chunks;
  Workspace ws;
  sizes.activations =
      Layout(device, config, micro_batch_size, partition, act_slots, io_slots, chunks, ws).builder.total_bytes();
  return sizes;
}

GradBufferLayout GPTModel::buffer_layout_for(const GPTConfig& config, const ModelPartition& partition,
                                             const GradBufferOptions& options) {
  // Megatron's shared_embedding: the tied word embedding when the first and last pipeline
  // stages each hold a copy (this rank holds the embedding or the head, not both).
  bool has_embedding = false, has_head = false;
  for (const ModelChunk& c : partition.chunks) {
    has_embedding |= c.has_embedding;
    has_head |= c.has_head;
  }
  const bool shared = !config.untie_embeddings_and_output_weights && has_embedding != has_head;
  std::vector<int64_t> numels;
  std::vector<bool> own_bucket;
  std::vector<int> chunks;
  // Under expert parallelism the experts' gradients are reduced over another group: buckets of their own.
  std::vector<bool> expert;
  for (const ParamShard& s : shard_params(config, partition)) {
    numels.push_back(s.numel());
    own_bucket.push_back(shared && (s.is_embedding_copy || s.spec.name == "embedding.word_embeddings.weight"));
    chunks.push_back(s.chunk);
    expert.push_back(partition.ep_size > 1 && s.is_expert);
  }
  return build_grad_buffer_layout(numels, options, own_bucket, chunks, expert);
}

GPTModel::GPTModel(const GPTConfig& config, Device& device, int micro_batch_size, const ModelPartition& partition,
                   const std::vector<int>& act_slots, const std::vector<int>& io_slots, Communicator* tp,
                   const GradBufferLayout* buffer_layout, Communicator* cp, Communicator* ep)
    : config_(config),
      device_(device),
      micro_batch_(micro_batch_size),
      partition_(partition),
      shards_(shard_params(config, partition)),
      buffer_layout_(buffer_layout ? *buffer_layout : buffer_layout_for(config, partition, {})),
      ws_(std::make_unique<Workspace>()),
      tp_(tp, partition.sequence_parallel, device,
          int64_t{micro_batch_size} * (config.seq_length / partition.cp_size) * config.hidden_size,
          config.params_dtype),
      cp_(partition.cp_size > 1 ? cp : nullptr),
      seq_(config.seq_length / partition.cp_size) {
  TESSERA_CHECK(tp_.size() == partition.tp_size, "the tensor-parallel group size differs from the partition's");
  TESSERA_CHECK(partition.cp_size == 1 || (cp && cp->size() == partition.cp_size && cp->rank() == partition.cp_rank),
                "the context-parallel group differs from the partition's");
  if (config.seq_length % (2 * partition.cp_size) != 0 && partition.cp_size > 1)
    throw usage_error("--seq-length " + std::to_string(config.seq_length) + " is not divisible by 2 x " +
                      "--context-parallel-size " + std::to_string(partition.cp_size));
  if (partition.sequence_parallel && seq_ % partition.tp_size != 0)
    throw usage_error("--seq-length " + std::to_string(config.seq_length) +
                      (partition.cp_size > 1 ? " / --context-parallel-size" : "") +
                      " is not divisible by --tensor-model-parallel-size with --sequence-parallel");
  vocab_start_ = int64_t{partition.tp_rank} * (config.padded_vocab_size / partition.tp_size);
  head_start_ = int64_t{partition.tp_rank} * (config.num_attention_heads / partition.tp_size);
  fused_attention_ = uses_fused_attention(config, device);

  // Parameters (in params_dtype) and their f32 gradients: one slab each, at the same element
  // offsets (the buffer layout's).
  TESSERA_CHECK(buffer_layout_.params.size() == shards_.size(), "the buffer layout is not for this model's parameters");
  const DType param_dtype = config.params_dtype;
  const size_t numel = static_cast<size_t>(buffer_layout_.numel);
  params_slab_ = Buffer(device, numel * dtype_size(param_dtype));
  grads_slab_ = Buffer(device, numel * sizeof(float));
  for (size_t i = 0; i < shards_.size(); ++i) {
    TESSERA_CHECK(buffer_layout_.params[i].numel == shards_[i].numel(),
                  "the buffer layout is not for this model's parameters");
    const size_t start = static_cast<size_t>(buffer_layout_.params[i].start);
    params_.push_back(tensor_at(params_slab_, start * dtype_size(param_dtype), param_dtype, shards_[i].shape));
    grads_.push_back(tensor_at(grads_slab_, start * sizeof(float), DType::F32, shards_[i].shape));
    index_.emplace(shards_[i].spec.name, i);
  }

  Layout layout(device, config, micro_batch_size, partition, act_slots, io_slots, chunks_, *ws_);
  acts_slab_ = Buffer(device, layout.builder.total_bytes());
  layout.bind(acts_slab_, chunks_, *ws_);
  if (config.moe.enabled()) {
    TESSERA_CHECK(partition.ep_size == 1 || (ep && ep->size() == partition.ep_size && ep->rank() == partition.ep_rank),
                  "the expert-parallel group differs from the partition's");
    moe_ = std::make_unique<MoELayer>(config_, device, layout.moe, tp_, partition.ep_size > 1 ? ep : nullptr, cp_);
    init_moe_workspace(ws_->moe, layout.moe);
    moe_losses_.load_balancing.assign(config.num_layers, 0.0);
    moe_losses_.z.assign(config.num_layers, 0.0);
  }

  // Each chunk's parameters are contiguous in shards_ (model_partition.cpp registers them
  // chunk by chunk): embedding, layers, head.
  size_t next = 0;
  for (Chunk& ch : chunks_) {
    TESSERA_CHECK(ch.range.end_layer > ch.range.first_layer, "every model chunk needs at least one layer");
    ch.first_param = next;
    auto take_named = [&](const char* name) {
      TESSERA_CHECK(next < shards_.size() && shards_[next].spec.name == name, std::string("expected ") + name);
      return next++;
    };
    auto take_optional = [&](const char* name) {
      return next < shards_.size() && shards_[next].spec.name == name ? next++ : kAbsent;
    };
    if (ch.range.has_embedding) {
      ch.wte = take_named("embedding.word_embeddings.weight");
      ch.wpe = take_optional("embedding.position_embeddings.weight");
    }
    ch.layers_first_param = next;
    for (int l = ch.range.first_layer; l < ch.range.end_layer; ++l) {
      const std::string prefix = "decoder.layers." + std::to_string(l) + ".";
      const size_t first = next;
      while (next < shards_.size() && shards_[next].spec.name.starts_with(prefix)) ++next;
      ch.layer_ranges.push_back({first, next});
      ch.w.push_back(layer_tensors(params_, first, next));
      ch.g.push_back(layer_tensors(grads_, first, next));
    }
    ch.layers_end_param = next;
    if (ch.range.has_head) {
      ch.lnf_w = take_named("decoder.final_layernorm.weight");
      ch.lnf_b = take_optional("decoder.final_layernorm.bias");
      ch.output_w = config.untie_embeddings_and_output_weights ? take_named("output_layer.weight")
                    : ch.range.has_embedding                  ? ch.wte
                                                              : take_named("embedding.word_embeddings.weight");
    }
    ch.end_param = next;
  }
  TESSERA_CHECK(next == shards_.size(), "model chunks do not cover the rank's parameters");
  grad_fill_ = grad_fill_ranges();
  assign_pending_.assign(chunks_.size(), false);
}

const Tensor& GPTModel::param(const std::string& name) const {
  auto it = index_.find(name);
  TESSERA_CHECK(it != index_.end(), "no parameter named " + name);
  return params_[it->second];
}

int64_t GPTModel::num_parameters() const {
  int64_t n = 0;
  for (const Tensor& p : params_) n += p.numel();
  return n;
}

size_t GPTModel::activation_bytes() const { return acts_slab_.bytes(); }

Tensor GPTModel::param_buffer() const {
  return tensor_at(params_slab_, 0, config_.params_dtype, {buffer_layout_.numel});
}
Tensor GPTModel::grad_buffer() const { return tensor_at(grads_slab_, 0, DType::F32, {buffer_layout_.numel}); }

Tensor GPTModel::logits() const {
  for (const Chunk& ch : chunks_)
    if (ch.range.has_head) return ch.acts.at(0).head.logits;
  throw runtime_error("this rank holds no output layer");
}

MoELossTracker GPTModel::take_moe_losses() {
  MoELossTracker taken = moe_losses_;
  std::fill(moe_losses_.load_balancing.begin(), moe_losses_.load_balancing.end(), 0.0);
  std::fill(moe_losses_.z.begin(), moe_losses_.z.end(), 0.0);
  return taken;
}

Tensor GPTModel::chunk_input(int chunk, int io_slot) const { return chunks_.at(chunk).io.at(io_slot).input; }
Tensor GPTModel::chunk_output(int chunk, int io_slot) const { return chunks_.at(chunk).io.at(io_slot).output; }
Tensor GPTModel::chunk_output_grad(int chunk, int io_slot) const { return chunks_.at(chunk).io.at(io_slot).output_grad; }
Tensor GPTModel::chunk_input_grad(int chunk, int io_slot) const { return chunks_.at(chunk).io.at(io_slot).input_grad; }

namespace {

// Where a shard's elements sit in its full parameter (ParamShard::full_index as a formula).
ops::ShardIndex shard_index(const ParamShard& s) {
  const ParamShard::Blocks b = s.blocks();
  return {b.first, b.block, b.full_stride};
}

}  // namespace

void GPTModel::init_weights() {
  const float std_normal = config_.init_method_std;
  const float std_scaled = config_.init_method_std / std::sqrt(2.0f * config_.num_layers);
  for (size_t i = 0; i < shards_.size(); ++i) {
    const ParamShard& s = shards_[i];
    switch (s.spec.init) {
      case ParamInit::Zeros: ops::fill(params_[i], 0.0f); break;
      case ParamInit::Ones: ops::fill(params_[i], 1.0f); break;
      case ParamInit::Normal:
      case ParamInit::ScaledNormal:
        ops::init_normal(params_[i], s.spec.init == ParamInit::Normal ? std_normal : std_scaled, config_.seed,
                         s.spec.id, shard_index(s));
        break;
    }
  }
}

void GPTModel::load_weights(const std::map<std::string, std::vector<float>>& weights) {
  std::vector<float> local;
  for (size_t i = 0; i < shards_.size(); ++i) {
    const ParamSpec& spec = shards_[i].spec;
    auto it = weights.find(spec.name);
    if (it == weights.end())
      throw runtime_error("initial weights lack parameter " + spec.name + " " + shape_str(spec.shape));
    if (static_cast<int64_t>(it->second.size()) != shape_numel(spec.shape))
      throw runtime_error("initial weights: " + spec.name + " has " + std::to_string(it->second.size()) +
                          " elements, the model expects " + shape_str(spec.shape));
    local.resize(static_cast<size_t>(params_[i].numel()));
    extract_shard(local.data(), it->second.data(), shards_[i]);
    copy_floats_from_host(params_[i], local.data(), local.size());
  }
}

void GPTModel::zero_grads() {
  const bool assign = !device_.deterministic_mode();
  assign_pending_.assign(chunks_.size(), assign);
  if (!assign) return device_.fill_zero(grads_slab_.handle(), 0, grads_slab_.bytes());
  for (auto [first, end] : grad_fill_) device_.fill_zero(grads_slab_.handle(), first, end - first);
}

// In backward order: the head's output layer (tied to the embedding on this chunk, it is still
// first: the embedding's scatter-add runs last), then per layer fc2's and fc1's weights, fc1's
// bias, the projection's weight, the QKV weight and bias. Not here: the norms, the position
// embedding, the row-parallel biases (proj, fc2: bias_add_backward or bias_dropout_add_backward
// after the tensor-parallel reduction) and an MoE layer's MLP (router, experts: a routed
// expert may get no token).
std::vector<Tensor> GPTModel::first_write_gradients(const Chunk& ch) const {
  std::vector<Tensor> out;
  if (ch.range.has_head) out.push_back(grads_[ch.output_w]);
  for (const LayerParams& g : ch.g) {
    const bool dense_mlp = g.moe.router.empty();
    for (const Tensor& t : {dense_mlp ? g.fc2_w : Tensor(), dense_mlp ? g.fc1_w : Tensor(),
                            dense_mlp ? g.fc1_b : Tensor(), g.proj_w, g.qkv_w, g.qkv_b})
      if (!t.empty()) out.push_back(t);
  }
  return out;
}

std::vector<std::pair<size_t, size_t>> GPTModel::grad_fill_ranges() const {
  std::vector<std::pair<size_t, size_t>> skip;
  for (const Chunk& ch : chunks_)
    for (const Tensor& t : first_write_gradients(ch)) skip.push_back({t.offset, t.offset + t.bytes()});
  std::sort(skip.begin(), skip.end());
  std::vector<std::pair<size_t, size_t>> fill;
  size_t at = 0;
  for (auto [first, end] : skip) {
    if (first > at) fill.push_back({at, first});
    at = std::max(at, end);
  }
  if (at < grads_slab_.bytes()) fill.push_back({at, grads_slab_.bytes()});
  return fill;
}

std::vector<size_t> GPTModel::squarable_grads() const {
  std::map<std::pair<void*, size_t>, size_t> shard_at;  // by memory
  for (size_t i = 0; i < grads_.size(); ++i)
    if (!grads_[i].empty()) shard_at[{grads_[i].handle, grads_[i].offset}] = i;
  std::vector<size_t> out;
  for (const Chunk& ch : chunks_)
    for (const LayerParams& g : ch.g) {
      const bool dense_mlp = g.moe.router.empty();
      for (const Tensor& t : {g.qkv_w, g.proj_w, dense_mlp ? g.fc1_w : Tensor(), dense_mlp ? g.fc2_w : Tensor()})
        if (!t.empty()) out.push_back(shard_at.at({t.handle, t.offset}));
    }
  return out;
}

void GPTModel::hand_grad_squares(Tensor sums, const std::vector<int64_t>& slot_of_shard) {
  TESSERA_CHECK(slot_of_shard.size() == grads_.size(), "hand_grad_squares: one slot per shard");
  squares_slot_.clear();
  for (size_t i : squarable_grads())
    if (slot_of_shard[i] >= 0) squares_slot_[{grads_[i].handle, grads_[i].offset}] = slot_of_shard[i];
  squares_sums_ = squares_slot_.empty() ? Tensor() : sums;
}

ops::GradSquares GPTModel::squares_of(const Tensor& grad, const StepContext& step) const {
  if (squares_sums_.empty() || !step.last_micro_batch || grad.empty()) return {};
  const auto it = squares_slot_.find({grad.handle, grad.offset});
  return it == squares_slot_.end() ? ops::GradSquares{} : ops::GradSquares{squares_sums_, it->second};
}

ops::GradWrite GPTModel::take_param_write(int chunk) {
  const bool first = assign_pending_.at(chunk);
  assign_pending_[chunk] = false;
  return first ? ops::GradWrite::Assign : ops::GradWrite::Accumulate;
}

GPTModel::LayerParams GPTModel::layer_tensors(const std::vector<Tensor>& all, size_t first, size_t end) const {
  auto get = [&](const char* suffix) -> Tensor {
    for (size_t i = first; i < end; ++i)
      if (shards_[i].spec.name.ends_with(suffix)) return all[i];
    return Tensor();
  };
  // SwiGLU's fc1 [2, Fl, C] is the [2Fl, C] weight of one linear: rows [gate_r; up_r].
  auto rows_of = [](const Tensor& w) { return w.empty() ? w : w.view({w.numel() / w.shape.back(), w.shape.back()}); };
  const Tensor fc1_w = get("mlp.linear_fc1.weight"), fc1_b = get("mlp.linear_fc1.bias");
  LayerParams p{get("input_layernorm.weight"), get("input_layernorm.bias"),
                get("self_attention.linear_qkv.weight"), get("self_attention.linear_qkv.bias"),
                get("self_attention.linear_proj.weight"), get("self_attention.linear_proj.bias"),
                get("pre_mlp_layernorm.weight"), get("pre_mlp_layernorm.bias"),
                rows_of(fc1_w), fc1_b.empty() ? fc1_b : fc1_b.view({fc1_b.numel()}),
                get("mlp.linear_fc2.weight"), get("mlp.linear_fc2.bias"), {}};
  p.moe.router = get("mlp.router.weight");
  for (int e = 0; e < config_.moe.num_experts; ++e) {
    const std::string expert = "mlp.experts.local_experts." + std::to_string(e) + ".";
    const Tensor fc1 = get((expert + "linear_fc1.weight").c_str());
    if (fc1.empty()) continue;  // another expert-parallel rank's expert
    p.moe.fc1.push_back(rows_of(fc1));
    p.moe.fc2.push_back(get((expert + "linear_fc2.weight").c_str()));
  }
  p.moe.shared_fc1 = rows_of(get("mlp.shared_experts.linear_fc1.weight"));
  p.moe.shared_fc2 = get("mlp.shared_experts.linear_fc2.weight");
  p.moe.shared_gate = get("mlp.shared_experts.gate_weight");
  return p;
}

ops::Dropout GPTModel::dropout(float p, int site, const StepContext& step, uint64_t element_offset) const {
  ops::Dropout d;
  d.p = step.training ? p : 0.0f;
  d.key = {config_.seed, step.iteration, static_cast<uint32_t>(site)};
  d.iteration = step.iteration_scalar;
  d.sample0 = step.first_sample;
  d.element_offset = element_offset;
  return d;
}

namespace {
Tensor rows(const Tensor& t) { return t.view({t.dim(0) * t.dim(1), t.numel() / (t.dim(0) * t.dim(1))}); }
Tensor flat_rows(const Tensor& t) { return t.view({t.numel()}); }
}  // namespace

// Each piece is one sample's rows at consecutive positions, so its element offset is the
// position of its first row (Dropout's per-sample index of the full [B,S,width] tensor).
std::vector<GPTModel::DropPiece> GPTModel::drop_pieces(const ops::Dropout& drop, int64_t B, int64_t rows,
                                                      int64_t first_row, int64_t width) const {
  const ops::SequenceRows at = cp_rows(config_.seq_length, partition_.cp_size, partition_.cp_rank);
  if (!cp_ || drop.p == 0.0f) {
    DropPiece whole{-1, 0, rows, drop};
    whole.dropout.element_offset = static_cast<uint64_t>(at.position(first_row) * width);
    return {whole};
  }
  std::vector<DropPiece> pieces;
  const int64_t runs[2][3] = {{0, at.split, at.first}, {at.split, seq_ - at.split, at.second}};
  for (int64_t b = 0; b < B; ++b)
    for (const auto& [r0, n, pos] : runs) {
      const int64_t lo = std::max(r0, first_row), hi = std::min(r0 + n, first_row + rows);
      if (lo >= hi) continue;
      DropPiece p{b, lo - first_row, hi - lo, drop};
      p.dropout.sample0 += static_cast<uint32_t>(b);
      p.dropout.element_offset = static_cast<uint64_t>((pos + lo - r0) * width);
      pieces.push_back(p);
    }
  return pieces;
}

Tensor GPTModel::cp_staging(const Tensor& whole) const { return ws_->cp_staging.slice_rows(0, whole.numel()); }

Tensor GPTModel::piece_of(const Tensor& t, const DropPiece& p) {
  if (p.b < 0 || t.empty()) return t;
  const int64_t rows_per_sample = t.dim(1), width = t.numel() / (t.dim(0) * rows_per_sample);
  return rows(t).slice_rows(p.b * rows_per_sample + p.row, p.rows).view({1, p.rows, width});
}

// The embedding runs on the whole sequence with the vocabulary split over TP ranks: each
// rank looks up the tokens it holds (zeros elsewhere), the sum over ranks is the lookup
// (Megatron's VocabParallelEmbedding), then positions are added and dropout applied.
void GPTModel::embedding_forward(Tensor out, const MicroBatch& batch, const StepContext& step) {
  const Chunk& ch = chunks_.front();
  Workspace& ws = *ws_;
  Tensor whole = tp_.sequence_parallel() ? ws.partial : out;
  ops::embedding_forward(whole, batch.tokens, batch.positions, params_[ch.wte], Tensor(), vocab_start_,
                         config_.padded_vocab_size);
  tp_.all_reduce(whole, ReduceOp::Sum);
  if (ch.wpe != kAbsent) {
    ops::embedding_forward(ws.pos_emb, batch.tokens, batch.positions, Tensor(), params_[ch.wpe], 0, 0);
    ops::residual_forward(whole, whole, ws.pos_emb);
  }
  const ops::Dropout drop = dropout(config_.hidden_dropout, kEmbeddingSite, step, 0);
  for (const DropPiece& p : drop_pieces(drop, micro_batch_, seq_, 0, config_.hidden_size))
    ops::dropout_forward(piece_of(whole, p), piece_of(whole, p), p.dropout);
  if (tp_.sequence_parallel()) tp_.scatter_forward(out, whole);
}

// Reads dL/d(embedding output) from ws.d_residual.
void GPTModel::embedding_backward(const MicroBatch& batch, const StepContext& step) {
  const Chunk& ch = chunks_.front();
  Workspace& ws = *ws_;
  Tensor d_whole = ws.d_residual;
  if (tp_.sequence_parallel()) {
    fill_zero(ws.d_C_whole);
    tp_.scatter_backward(ws.d_C_whole, ws.d_residual);
    d_whole = ws.d_C_whole;
  }
  const ops::Dropout drop = dropout(config_.hidden_dropout, kEmbeddingSite, step, 0);
  for (const DropPiece& p : drop_pieces(drop, micro_batch_, seq_, 0, config_.hidden_size))
    ops::dropout_backward(piece_of(ws.d_ln_whole, p), piece_of(d_whole, p), p.dropout, kAssign);
  ops::embedding_backward(grads_[ch.wte], param_or_empty(grads_, ch.wpe), ws.d_ln_whole, batch.tokens, batch.positions, vocab_start_,
                          config_.padded_vocab_size);
}

// LayerNorm (or RMSNorm) of a branch's input, then into the tensor-parallel region (whole
// sequence).
void GPTModel::norm_in_forward(Tensor ln, Tensor ln_whole, Tensor mean, Tensor rstd, Tensor in, Tensor weight,
                               Tensor bias) {
  if (config_.normalization == Normalization::RMSNorm)
    ops::rmsnorm_forward(rows(ln), flat_rows(rstd), rows(in), weight, config_.norm_epsilon);
  else
    ops::layernorm_forward(rows(ln), flat_rows(mean), flat_rows(rstd), rows(in), weight, bias, config_.norm_epsilon);
  tp_.enter_forward(ln_whole, ln);
}

// Its backward: reads dL/d(ln_whole) from ws.d_ln_whole, adds (or with Assign, writes)
// dL/d(in) into ws.d_residual and accumulates the LayerNorm's gradients.
void GPTModel::norm_in_backward(Tensor in, Tensor weight, Tensor d_weight, Tensor d_bias, Tensor mean, Tensor rstd,
                                ops::GradWrite write) {
  Workspace& ws = *ws_;
  if (tp_.sequence_parallel()) fill_zero(ws.d_ln);
  tp_.enter_backward(ws.d_ln, ws.d_ln_whole);
  if (config_.normalization == Normalization::RMSNorm)
    ops::rmsnorm_backward(rows(ws.d_residual), d_weight, rows(ws.d_ln), rows(in), weight, flat_rows(rstd), write);
  else
    ops::layernorm_backward(rows(ws.d_residual), d_weight, d_bias, rows(ws.d_ln), rows(in), weight, flat_rows(mean),
                            flat_rows(rstd), write);
}

// A branch's end (Megatron's row-parallel linear and bias-dropout-add):
// out = residual + dropout(sum over TP ranks of inp @ W^T, + b).
void GPTModel::row_out_forward(Tensor out, Tensor residual, Tensor inp, Tensor weight, Tensor bias,
                               const ops::Dropout& drop) {
  ops::linear_forward(rows(ws_->partial), rows(inp), weight, Tensor());
  branch_out_forward(out, residual, bias, drop);
}

// A branch's end from its partial output in ws.partial: out = residual + dropout(sum over
// TP ranks of it, + b).
void GPTModel::branch_out_forward(Tensor out, Tensor residual, Tensor bias, const ops::Dropout& drop) {
  Workspace& ws = *ws_;
  tp_.leave_forward(ws.reduced, ws.partial);
  const std::vector<DropPiece> pieces = hidden_drop_pieces(drop);
  if (uses_fused_epilogue(device_, ops::bias_dropout_add_forward)) {
    for (const DropPiece& p : pieces)
      ops::bias_dropout_add_forward(piece_of(out, p), piece_of(ws.reduced, p), bias, piece_of(residual, p), p.dropout);
    return;
  }
  if (!bias.empty()) ops::bias_add_forward(rows(ws.reduced), rows(ws.reduced), bias);
  for (const DropPiece& p : pieces) ops::dropout_forward(piece_of(ws.reduced, p), piece_of(ws.reduced, p), p.dropout);
  ops::residual_forward(out, residual, ws.reduced);
}

// Its backward from ws.d_residual (the residual path keeps it): the weight and bias
// gradients, and dL/d(inp) into d_inp (overwritten).
void GPTModel::row_out_backward(Tensor d_inp, Tensor inp, Tensor weight, Tensor d_weight, Tensor d_bias,
                                const ops::Dropout& drop, ops::GradWrite param_write,
                                const ops::GradSquares& squares) {
  branch_out_backward(d_bias, drop);
  ops::linear_backward(rows(d_inp), d_weight, Tensor(), rows(ws_->d_C_whole), rows(inp), weight, kAssign, param_write,
                       squares);
}

// Its backward from ws.d_residual: the bias gradient, and dL/d(partial output) into
// ws.d_C_whole.
void GPTModel::branch_out_backward(Tensor d_bias, const ops::Dropout& drop) {
  Workspace& ws = *ws_;
  const std::vector<DropPiece> pieces = hidden_drop_pieces(drop);
  if (uses_fused_epilogue(device_, ops::bias_dropout_add_backward)) {
    for (const DropPiece& p : pieces)
      ops::bias_dropout_add_backward(piece_of(ws.d_C, p), d_bias, Tensor(), piece_of(ws.d_residual, p), p.dropout,
                                     kAssign);
  } else {
    for (const DropPiece& p : pieces)
      ops::dropout_backward(piece_of(ws.d_C, p), piece_of(ws.d_residual, p), p.dropout, kAssign);
    if (!d_bias.empty()) ops::bias_add_backward(d_bias, rows(ws.d_C));
  }
  if (tp_.sequence_parallel()) fill_zero(ws.d_C_whole);
  tp_.leave_backward(ws.d_C_whole, ws.d_C);
}

void GPTModel::layer_forward(int l, const LayerParams& w, LayerActs& a, Tensor in, Tensor out,
                             const StepContext& step) {
  // Attention: column-parallel QKV over this rank's heads, row-parallel projection.
  norm_in_forward(a.ln1, a.ln1_whole, a.ln1_mean, a.ln1_rstd, in, w.ln1_w, w.ln1_b);
  ops::linear_forward(rows(a.qkv), rows(a.ln1_whole), w.qkv_w, w.qkv_b);
  attention_forward(l, a, step);
  row_out_forward(a.residual_mid, in, a.ctx, w.proj_w, w.proj_b,
                  dropout(config_.hidden_dropout, layer_site(l, kAfterAttention), step, 0));
  norm_in_forward(a.ln2, a.ln2_whole, a.ln2_mean, a.ln2_rstd, a.residual_mid, w.ln2_w, w.ln2_b);
  mlp_forward(l, w, a, out, step);
}

// MLP: column-parallel fc1, row-parallel fc2; or the MoE layer's router and experts.
void GPTModel::mlp_forward(int l, const LayerParams& w, LayerActs& a, Tensor out, const StepContext& step) {
  const ops::Dropout drop = dropout(config_.hidden_dropout, layer_site(l, kAfterMlp), step, 0);
  if (a.moe) {
    moe_->forward(w.moe, *a.moe, ws_->moe, rows(a.ln2_whole), rows(ws_->partial));
    if (step.training) {
      moe_losses_.load_balancing[l] += a.moe->routing.load_balancing_loss;
      moe_losses_.z[l] += a.moe->routing.z_loss;
    }
    return branch_out_forward(out, a.residual_mid, Tensor(), drop);
  }
  if (config_.swiglu) {
    ops::linear_forward(rows(a.fc1), rows(a.ln2_whole), w.fc1_w, w.fc1_b);
    ops::swiglu_forward(rows(a.act), rows(a.fc1));
  } else if (uses_fused_epilogue(device_, ops::linear_bias_gelu_forward)) {
    ops::linear_bias_gelu_forward(rows(a.act), rows(a.fc1), rows(a.ln2_whole), w.fc1_w, w.fc1_b, config_.gelu);
  } else {
    ops::linear_forward(rows(a.fc1), rows(a.ln2_whole), w.fc1_w, w.fc1_b);
    ops::gelu_forward(a.act, a.fc1, config_.gelu);
  }
  row_out_forward(out, a.residual_mid, a.act, w.fc2_w, w.fc2_b, drop);
}

// ctx and the saved state from qkv: one process's fused or unfused attention, or with context
// parallelism the ring (fused) or the gathered sequence (unfused).
void GPTModel::attention_forward(int l, LayerActs& a, const StepContext& step) {
  Workspace& ws = *ws_;
  const int64_t groups = config_.query_groups() / tp_.size();
  const ops::Dropout drop = attention_dropout(l, step);
  if (fused_attention_ && cp_)
    return ring_attention_forward(*cp_, ws.ring, a.ctx, a.att, a.qkv, groups, config_.rope(), drop,
                                  config_.seq_length);
  if (fused_attention_) return ops::flash_attention_forward(a.ctx, a.att, a.qkv, Tensor(), groups, config_.rope(), drop, {});
  if (!cp_) return ops::attention_forward(a.ctx, a.att, attention_heads(a.qkv), drop);
  cp_gather_sequence(*cp_, ws.qkv_whole, cp_staging(ws.qkv_whole), a.qkv);
  ops::attention_forward(ws.ctx_whole, a.att, attention_heads(ws.qkv_whole), drop);
  cp_take_local(a.ctx, ws.ctx_whole, partition_.cp_size, partition_.cp_rank);
}

// The attention probabilities' dropout: this rank's heads start at head_start_ of the sample's
// full [heads, T, T] tensor.
ops::Dropout GPTModel::attention_dropout(int l, const StepContext& step) const {
  const int64_t T = config_.seq_length;
  return dropout(config_.attention_dropout, layer_site(l, kAttentionProbs), step,
                 static_cast<uint64_t>(head_start_ * T * T));
}

// What the unfused attention reads: the per-head [q;k;v] that attention_qkv builds from this layer's
// grouped projection into the shared ws.heads (forward, and again in backward: a copy with
// a rotation, cheaper to redo than to keep per layer), or the projection itself for GPT.
Tensor GPTModel::attention_heads(Tensor qkv) {
  if (!config_.regroups_qkv()) return qkv;
  ops::attention_qkv_forward(ws_->heads, qkv, config_.query_groups() / tp_.size(), config_.rope());
  return ws_->heads;
}

// ws.d_residual carries dL/d(layer output) in and dL/d(layer input) out: the identity path
// of each residual add leaves it in place while the branch gradients are added to it.
void GPTModel::layer_backward(int l, const LayerParams& w, const LayerParams& g, LayerActs& a, Tensor in,
                              const StepContext& step, ops::GradWrite param_write) {
  Workspace& ws = *ws_;
  mlp_backward(l, w, g, a, step, param_write);
  norm_in_backward(a.residual_mid, w.ln2_w, g.ln2_w, g.ln2_b, a.ln2_mean, a.ln2_rstd);
  // Attention branch.
  row_out_backward(ws.d_ctx, a.ctx, w.proj_w, g.proj_w, g.proj_b,
                   dropout(config_.hidden_dropout, layer_site(l, kAfterAttention), step, 0), param_write,
                   squares_of(g.proj_w, step));
  attention_backward(l, a, step);
  ops::linear_backward(rows(ws.d_ln_whole), g.qkv_w, g.qkv_b, rows(ws.d_qkv), rows(a.ln1_whole), w.qkv_w, kAssign,
                       param_write, squares_of(g.qkv_w, step));
  norm_in_backward(in, w.ln1_w, g.ln1_w, g.ln1_b, a.ln1_mean, a.ln1_rstd);
}

// The MLP branch's backward from ws.d_residual: dL/d(its normalised input) into ws.d_ln_whole.
void GPTModel::mlp_backward(int l, const LayerParams& w, const LayerParams& g, LayerActs& a, const StepContext& step,
                            ops::GradWrite param_write) {
  Workspace& ws = *ws_;
  const ops::Dropout drop = dropout(config_.hidden_dropout, layer_site(l, kAfterMlp), step, 0);
  if (a.moe) {
    branch_out_backward(Tensor(), drop);
    return moe_->backward(w.moe, g.moe, *a.moe, ws.moe, rows(a.ln2_whole), rows(ws.d_C_whole), rows(ws.d_ln_whole),
                          step.moe_aux_scale);
  }
  row_out_backward(ws.d_act, a.act, w.fc2_w, g.fc2_w, g.fc2_b, drop, param_write, squares_of(g.fc2_w, step));
  if (!config_.swiglu && uses_fused_epilogue(device_, ops::linear_bias_gelu_backward)) {
    // dL/d(fc1) overwrites dL/d(act) in place.
    ops::linear_bias_gelu_backward(rows(ws.d_ln_whole), g.fc1_w, g.fc1_b, rows(ws.d_act), rows(ws.d_act),
                                   rows(a.ln2_whole), w.fc1_w, rows(a.fc1), config_.gelu, kAssign, param_write,
                                   squares_of(g.fc1_w, step));
  } else {
    if (config_.swiglu)
      ops::swiglu_backward(rows(ws.d_F), rows(ws.d_act), rows(a.fc1), kAssign);
    else
      ops::gelu_backward(ws.d_F, ws.d_act, a.fc1, config_.gelu, kAssign);
    ops::linear_backward(rows(ws.d_ln_whole), g.fc1_w, g.fc1_b, rows(ws.d_F), rows(a.ln2_whole), w.fc1_w, kAssign,
                         param_write, squares_of(g.fc1_w, step));
  }
}

// dL/d(qkv) into ws.d_qkv (overwritten) from dL/d(ctx) in ws.d_ctx.
void GPTModel::attention_backward(int l, LayerActs& a, const StepContext& step) {
  Workspace& ws = *ws_;
  const int64_t groups = config_.query_groups() / tp_.size();
  const ops::Dropout drop = attention_dropout(l, step);
  if (fused_attention_) {
    fill_zero(ws.d_qkv);
    if (cp_)
      ring_attention_backward(*cp_, ws.ring, ws.d_qkv, ws.d_att, ws.d_ctx, a.qkv, a.ctx, a.att, groups, config_.rope(),
                              drop, config_.seq_length);
    else
      ops::flash_attention_backward(ws.d_qkv, Tensor(), ws.d_att, ws.d_ctx, a.qkv, Tensor(), a.ctx, a.att, groups,
                                    config_.rope(), drop, {});
    return;
  }
  // The unfused ops, on the whole sequence gathered over context-parallel ranks.
  Tensor qkv = a.qkv, ctx = a.ctx, d_ctx = ws.d_ctx, d_qkv = ws.d_qkv;
  if (cp_) {
    cp_gather_sequence(*cp_, ws.qkv_whole, cp_staging(ws.qkv_whole), a.qkv);
    cp_gather_sequence(*cp_, ws.d_ctx_whole, cp_staging(ws.d_ctx_whole), ws.d_ctx);
    qkv = ws.qkv_whole, ctx = ws.ctx_whole, d_ctx = ws.d_ctx_whole, d_qkv = ws.d_qkv_whole;
  }
  const Tensor heads = attention_heads(qkv);
  if (config_.recompute == Recompute::Selective)  // the probabilities were not kept
    ops::attention_forward(ctx, a.att, heads, drop);
  fill_zero(ws.d_heads);
  ops::attention_backward(ws.d_heads, ws.d_att, d_ctx, heads, a.att, drop);
  if (config_.regroups_qkv()) {
    fill_zero(d_qkv);
    ops::attention_qkv_backward(d_qkv, ws.d_heads, groups, config_.rope());
  }
  if (cp_) cp_take_local(ws.d_qkv, d_qkv, partition_.cp_size, partition_.cp_rank);
}

// Final LayerNorm, the vocabulary-parallel output layer and cross-entropy: the logits stay
// split over TP ranks; only per-row maxima and sums cross ranks (Megatron's
// vocab_parallel_cross_entropy).
void GPTModel::head_forward(const Chunk& ch, HeadActs& h, Tensor in, const MicroBatch& batch, Tensor loss_sums) {
  Workspace& ws = *ws_;
  const int64_t N = batch.labels.numel();
  norm_in_forward(h.lnf, h.lnf_whole, h.lnf_mean, h.lnf_rstd, in, params_[ch.lnf_w], param_or_empty(params_, ch.lnf_b));
  ops::linear_forward(rows(h.logits), rows(h.lnf_whole), params_[ch.output_w], Tensor());
  const Tensor sum_exp = ws.ce_sums.slice_rows(0, 1).view({N}), target_logit = ws.ce_sums.slice_rows(1, 1).view({N});
  if (uses_cross_entropy_stats(tp_.size(), device_)) {
    ops::cross_entropy_stats(ws.row_max, sum_exp, target_logit, rows(h.logits), flat_rows(batch.labels));
  } else {
    ops::cross_entropy_max(ws.row_max, rows(h.logits));
    tp_.all_reduce(ws.row_max, ReduceOp::Max);
    ops::cross_entropy_sums(sum_exp, target_logit, rows(h.logits), flat_rows(batch.labels), ws.row_max, vocab_start_,
                            config_.padded_vocab_size);
    tp_.all_reduce(ws.ce_sums, ReduceOp::Sum);
  }
  ops::cross_entropy_finish(flat_rows(h.losses), flat_rows(h.logsumexp), sum_exp, ws.row_max, target_logit);
  ops::masked_loss_sums(loss_sums, flat_rows(h.losses), flat_rows(batch.loss_mask));
}

// Leaves dL/d(head input) in ws.d_residual (overwritten). The logits' gradient overwrites
// the logits, as Megatron's vocab-parallel cross-entropy turns its saved softmax (the
// logits' memory) into the gradient (megatron/core/tensor_parallel/cross_entropy.py), so no
// [N,Vl] buffer is kept or zeroed.
void GPTModel::head_backward(const Chunk& ch, HeadActs& h, Tensor in, const MicroBatch& batch, float loss_weight,
                             ops::GradWrite param_write) {
  Workspace& ws = *ws_;
  ops::masked_loss_backward(flat_rows(ws.d_losses), flat_rows(batch.loss_mask), loss_weight, kAssign);
  const Tensor d_logits = rows(h.logits);
  ops::cross_entropy_backward(d_logits, flat_rows(ws.d_losses), rows(h.logits), flat_rows(batch.labels),
                              flat_rows(h.logsumexp), vocab_start_, config_.padded_vocab_size, kAssign);
  ops::linear_backward(rows(ws.d_ln_whole), grads_[ch.output_w], Tensor(), d_logits, rows(h.lnf_whole),
                       params_[ch.output_w], kAssign, param_write);
  norm_in_backward(in, params_[ch.lnf_w], grads_[ch.lnf_w], param_or_empty(grads_, ch.lnf_b), h.lnf_mean, h.lnf_rstd,
                   kAssign);
}

// The activations of chunk-local layer i for this slot: its own, or the shared ones of a
// recomputed group; `in`/`out` are the tensors it reads and writes.
GPTModel::LayerIo GPTModel::layer_io(Chunk& ch, ActSlot& acts, IoSlot& io, int i) {
  const int n = static_cast<int>(ch.w.size());
  const LayerGroup& g = ch.groups[ch.group_of[i]];
  auto out_of = [&](int l) -> Tensor {
    if (l + 1 == n) return io.output;
    const LayerGroup& lg = ch.groups[ch.group_of[l]];
    return lg.recomputed && l + 1 < lg.end ? ws_->recomputed[l - lg.first].out : acts.layers[l].out;
  };
  LayerActs& a = g.recomputed ? ws_->recomputed[i - g.first] : acts.layers[i];
  return {&a, i == 0 ? io.input : out_of(i - 1), out_of(i)};
}

double GPTModel::forward(const MicroBatch& batch, const StepContext& step) {
  const Tensor sums = ws_->loss_sums;
  TESSERA_CHECK(!sums.empty(), "the single-slot forward needs the whole model (this rank holds no output layer)");
  fill_zero(sums);
  forward(0, {}, batch, step, sums);
  double host[2];
  copy_to_host(host, sizeof(host), sums);
  return host[0];
}

void GPTModel::forward(int chunk, SlotRef slot, const MicroBatch& batch, const StepContext& step, Tensor loss_sums) {
  TESSERA_CHECK(batch.tokens.numel() == int64_t{micro_batch_} * seq_,
                "micro-batch shape " + shape_str(batch.tokens.shape));
  Chunk& ch = chunks_.at(chunk);
  ActSlot& acts = ch.acts.at(slot.act);
  IoSlot& io = ch.io.at(slot.io);
  if (ch.range.has_embedding) {
    need_params(ch.first_param, ch.layers_first_param);
    embedding_forward(io.input, batch, step);
  }
  for (int i = 0; i < static_cast<int>(ch.w.size()); ++i) {
    const LayerIo l = layer_io(ch, acts, io, i);
    need_params(ch.layer_ranges[i].first, ch.layer_ranges[i].second);
    layer_forward(ch.range.first_layer + i, ch.w[i], *l.acts, l.in, l.out, step);
  }
  if (ch.range.has_head) {
    need_params(ch.layers_end_param, ch.end_param);
    head_forward(ch, acts.head, io.output, batch, loss_sums);
  }
}

void GPTModel::backward(int chunk, SlotRef slot, const MicroBatch& batch, const StepContext& step, float loss_weight,
                        const GradsReady& grads_ready) {
  auto ready = [&](size_t first, size_t end) {
    if (grads_ready && first < end) grads_ready(first, end);
  };
  Chunk& ch = chunks_.at(chunk);
  ActSlot& acts = ch.acts.at(slot.act);
  IoSlot& io = ch.io.at(slot.io);
  Workspace& ws = *ws_;
  const ops::GradWrite param_write = take_param_write(chunk);
  if (ch.range.has_head) {
    head_backward(ch, acts.head, io.output, batch, loss_weight, param_write);
    ready(ch.layers_end_param, ch.end_param);
  } else {
    copy_tensor(ws.d_residual, io.output_grad);
  }
  for (int gi = static_cast<int>(ch.groups.size()) - 1; gi >= 0; --gi) {
    const LayerGroup& g = ch.groups[gi];
    // Recomputation reruns the group's forward from its kept input: the same operations on
    // the same inputs (and the same counter-keyed dropout masks) give the same bits.
    if (g.recomputed)
      for (int i = g.first; i < g.end; ++i) {
        const LayerIo l = layer_io(ch, acts, io, i);
        layer_forward(ch.range.first_layer + i, ch.w[i], *l.acts, l.in, l.out, step);
      }
    for (int i = g.end - 1; i >= g.first; --i) {
      const LayerIo l = layer_io(ch, acts, io, i);
      layer_backward(ch.range.first_layer + i, ch.w[i], ch.g[i], *l.acts, l.in, step, param_write);
      ready(ch.layer_ranges[i].first, ch.layer_ranges[i].second);
    }
  }
  if (ch.range.has_embedding) {
    embedding_backward(batch, step);
    ready(ch.first_param, ch.layers_first_param);
  } else {
    copy_tensor(io.input_grad, ws.d_residual);
  }
}

}  // namespace tessera
