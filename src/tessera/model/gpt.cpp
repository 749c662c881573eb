#include "tessera/model/gpt.h"

#include <algorithm>
#include <cmath>

#include "tessera/core/error.h"
#include "tessera/core/rng.h"
#include "tessera/device/device.h"
#include "tessera/ops/ops.h"

namespace tessera {
namespace {

// Dropout sites: 0 is the embedding; each layer has three (attention probabilities, after
// the attention projection, after the MLP). Part of the RNG key, so fixed forever.
constexpr int kEmbeddingSite = 0;
constexpr int kSitesPerLayer = 3;
int layer_site(int layer, int which) { return 1 + layer * kSitesPerLayer + which; }
enum LayerSite { kAttentionProbs = 0, kAfterAttention = 1, kAfterMlp = 2 };

}  // namespace

GPTModel::GPTModel(const GPTConfig& config, Device& device, int micro_batch_size)
    : config_(config), device_(device), micro_batch_(micro_batch_size), specs_(gpt_param_specs(config)) {
  // Parameters and gradients: one slab each, same offsets.
  SlabBuilder param_layout;
  std::vector<size_t> offsets;
  for (const ParamSpec& s : specs_) offsets.push_back(param_layout.reserve(DType::F32, s.shape));
  params_slab_ = Buffer(device, param_layout.total_bytes());
  grads_slab_ = Buffer(device, param_layout.total_bytes());
  for (size_t i = 0; i < specs_.size(); ++i) {
    params_.push_back(tensor_at(params_slab_, offsets[i], DType::F32, specs_[i].shape));
    grads_.push_back(tensor_at(grads_slab_, offsets[i], DType::F32, specs_[i].shape));
    index_[specs_[i].name] = i;
  }
  for (int l = 0; l < config.num_layers; ++l) {
    layer_params_.push_back(layer_tensors(params_, l));
    layer_grads_.push_back(layer_tensors(grads_, l));
    layer_ranges_.push_back(layer_param_range(l));
  }

  // Activations of one micro-batch.
  const int64_t B = micro_batch_size, T = config.seq_length, C = config.hidden_size;
  const int64_t A = config.attention_width(), F = config.ffn_hidden_size, V = config.padded_vocab_size;
  const int64_t NH = config.num_attention_heads;
  struct Pending {
    Tensor* t;
    DType dtype;
    Shape shape;
    size_t offset;
  };
  std::vector<Pending> pending;
  SlabBuilder act_layout;
  auto reserve = [&](Tensor& t, Shape shape, DType dtype = DType::F32) {
    pending.push_back({&t, dtype, shape, act_layout.reserve(dtype, shape)});
  };
  acts_.layers.resize(config.num_layers);
  reserve(acts_.embedded, {B, T, C});
  for (LayerActs& l : acts_.layers) {
    reserve(l.ln1, {B, T, C});
    reserve(l.ln1_mean, {B, T});
    reserve(l.ln1_rstd, {B, T});
    reserve(l.qkv, {B, T, 3 * A});
    reserve(l.att, {B, NH, T, T});
    reserve(l.ctx, {B, T, A});
    reserve(l.residual_mid, {B, T, C});
    reserve(l.ln2, {B, T, C});
    reserve(l.ln2_mean, {B, T});
    reserve(l.ln2_rstd, {B, T});
    reserve(l.fc1, {B, T, F});
    reserve(l.gelu, {B, T, F});
  }
  for (int l = 0; l + 1 < config.num_layers; ++l) reserve(acts_.layers[l + 1].residual_in, {B, T, C});
  reserve(acts_.residual_out, {B, T, C});
  reserve(acts_.lnf, {B, T, C});
  reserve(acts_.lnf_mean, {B, T});
  reserve(acts_.lnf_rstd, {B, T});
  reserve(acts_.logits, {B, T, V});
  reserve(acts_.losses, {B, T});
  reserve(acts_.scratch_C, {B, T, C});
  reserve(acts_.d_residual, {B, T, C});
  reserve(acts_.d_C, {B, T, C});
  reserve(acts_.d_ln, {B, T, C});
  reserve(acts_.d_ctx, {B, T, A});
  reserve(acts_.d_qkv, {B, T, 3 * A});
  reserve(acts_.d_att, {B, NH, T, T});
  reserve(acts_.d_F, {B, T, F});
  reserve(acts_.d_gelu, {B, T, F});
  reserve(acts_.d_logits, {B, T, V});
  reserve(acts_.d_losses, {B, T});
  acts_slab_ = Buffer(device, act_layout.total_bytes());
  for (Pending& p : pending) *p.t = tensor_at(acts_slab_, p.offset, p.dtype, p.shape);
  // Layer l reads the previous layer's output; layer 0 reads the embedding output.
  TESSERA_CHECK(config.num_layers > 0, "a GPT needs at least one layer");
  acts_.layers[0].residual_in = acts_.embedded;
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

void GPTModel::init_weights() {
  const float std_normal = config_.init_method_std;
  const float std_scaled = config_.init_method_std / std::sqrt(2.0f * config_.num_layers);
  for (size_t i = 0; i < specs_.size(); ++i) {
    const ParamSpec& s = specs_[i];
    float* p = params_[i].f32();
    const int64_t n = params_[i].numel();
    switch (s.init) {
      case ParamInit::Zeros:
        for (int64_t e = 0; e < n; ++e) p[e] = 0.0f;
        break;
      case ParamInit::Ones:
        for (int64_t e = 0; e < n; ++e) p[e] = 1.0f;
        break;
      case ParamInit::Normal:
      case ParamInit::ScaledNormal: {
        const float std = s.init == ParamInit::Normal ? std_normal : std_scaled;
#pragma omp parallel for schedule(static)
        for (int64_t e = 0; e < n; ++e) p[e] = std * philox_normal(config_.seed, s.id, static_cast<uint64_t>(e));
        break;
      }
    }
  }
}

void GPTModel::load_weights(const std::map<std::string, std::vector<float>>& weights) {
  for (size_t i = 0; i < specs_.size(); ++i) {
    auto it = weights.find(specs_[i].name);
    if (it == weights.end())
      throw runtime_error("initial weights lack parameter " + specs_[i].name + " " + shape_str(specs_[i].shape));
    if (static_cast<int64_t>(it->second.size()) != params_[i].numel())
      throw runtime_error("initial weights: " + specs_[i].name + " has " + std::to_string(it->second.size()) +
                          " elements, the model expects " + shape_str(specs_[i].shape));
    device_.copy_from_host(params_[i].ptr, it->second.data(), params_[i].bytes());
  }
}

void GPTModel::zero_grads() { device_.fill_zero(grads_slab_.data(), grads_slab_.bytes()); }

GPTModel::LayerParams GPTModel::layer_tensors(const std::vector<Tensor>& all, int layer) const {
  std::string p = "decoder.layers." + std::to_string(layer) + ".";
  auto get = [&](const char* suffix) -> Tensor {
    auto it = index_.find(p + suffix);
    return it == index_.end() ? Tensor() : all[it->second];
  };
  return {get("input_layernorm.weight"), get("input_layernorm.bias"),
          get("self_attention.linear_qkv.weight"), get("self_attention.linear_qkv.bias"),
          get("self_attention.linear_proj.weight"), get("self_attention.linear_proj.bias"),
          get("pre_mlp_layernorm.weight"), get("pre_mlp_layernorm.bias"),
          get("mlp.linear_fc1.weight"), get("mlp.linear_fc1.bias"),
          get("mlp.linear_fc2.weight"), get("mlp.linear_fc2.bias")};
}

ops::Dropout GPTModel::dropout(float p, int site, const StepContext& step) const {
  ops::Dropout d;
  d.p = step.training ? p : 0.0f;
  d.key = {config_.seed, step.iteration, static_cast<uint32_t>(site)};
  d.sample0 = step.first_sample;
  return d;
}

double GPTModel::forward(const MicroBatch& batch, const StepContext& step) {
  const int64_t B = micro_batch_, T = config_.seq_length;
  TESSERA_CHECK(batch.tokens.numel() == B * T, "micro-batch shape " + shape_str(batch.tokens.shape));
  auto rows = [&](const Tensor& t) { return t.view({B * T, t.numel() / (B * T)}); };
  const Tensor& wte = param("embedding.word_embeddings.weight");
  const Tensor& output_w = config_.untie_embeddings_and_output_weights ? param("output_layer.weight") : wte;

  ops::embedding_forward(acts_.embedded, batch.tokens, batch.positions, wte,
                         param("embedding.position_embeddings.weight"));
  ops::dropout_forward(acts_.embedded, acts_.embedded, dropout(config_.hidden_dropout, kEmbeddingSite, step));

  for (int l = 0; l < config_.num_layers; ++l) {
    LayerActs& a = acts_.layers[l];
    const LayerParams& w = layer_params_[l];
    const Tensor& out = l + 1 < config_.num_layers ? acts_.layers[l + 1].residual_in : acts_.residual_out;
    ops::layernorm_forward(rows(a.ln1), a.ln1_mean.view({B * T}), a.ln1_rstd.view({B * T}), rows(a.residual_in),
                           w.ln1_w, w.ln1_b, config_.norm_epsilon);
    ops::linear_forward(rows(a.qkv), rows(a.ln1), w.qkv_w, w.qkv_b);
    ops::attention_forward(a.ctx, a.att, a.qkv, dropout(config_.attention_dropout, layer_site(l, kAttentionProbs), step));
    ops::linear_forward(rows(acts_.scratch_C), rows(a.ctx), w.proj_w, w.proj_b);
    ops::dropout_forward(acts_.scratch_C, acts_.scratch_C, dropout(config_.hidden_dropout, layer_site(l, kAfterAttention), step));
    ops::residual_forward(a.residual_mid, a.residual_in, acts_.scratch_C);
    ops::layernorm_forward(rows(a.ln2), a.ln2_mean.view({B * T}), a.ln2_rstd.view({B * T}), rows(a.residual_mid),
                           w.ln2_w, w.ln2_b, config_.norm_epsilon);
    ops::linear_forward(rows(a.fc1), rows(a.ln2), w.fc1_w, w.fc1_b);
    ops::gelu_forward(a.gelu, a.fc1, config_.gelu);
    ops::linear_forward(rows(acts_.scratch_C), rows(a.gelu), w.fc2_w, w.fc2_b);
    ops::dropout_forward(acts_.scratch_C, acts_.scratch_C, dropout(config_.hidden_dropout, layer_site(l, kAfterMlp), step));
    ops::residual_forward(out, a.residual_mid, acts_.scratch_C);
  }
  ops::layernorm_forward(rows(acts_.lnf), acts_.lnf_mean.view({B * T}), acts_.lnf_rstd.view({B * T}), rows(acts_.residual_out),
                         param("decoder.final_layernorm.weight"), param("decoder.final_layernorm.bias"),
                         config_.norm_epsilon);
  ops::linear_forward(rows(acts_.logits), rows(acts_.lnf), output_w, Tensor());
  ops::cross_entropy_forward(acts_.losses.view({B * T}), rows(acts_.logits), batch.labels.view({B * T}));

  const float* loss = acts_.losses.f32();
  const float* mask = batch.loss_mask.f32();
  double sum = 0.0;
  for (int64_t i = 0; i < B * T; ++i) sum += static_cast<double>(loss[i]) * mask[i];
  return sum;
}

std::pair<size_t, size_t> GPTModel::layer_param_range(int layer) const {
  const std::string prefix = "decoder.layers." + std::to_string(layer) + ".";
  size_t first = specs_.size(), end = 0;
  for (size_t i = 0; i < specs_.size(); ++i)
    if (specs_[i].name.starts_with(prefix)) first = std::min(first, i), end = std::max(end, i + 1);
  return {first, end};
}

void GPTModel::backward(const MicroBatch& batch, const StepContext& step, float loss_weight,
                        const GradsReady& grads_ready) {
  auto ready = [&](size_t first, size_t end) {
    if (grads_ready && first < end) grads_ready(first, end);
  };
  const int64_t B = micro_batch_, T = config_.seq_length;
  auto rows = [&](const Tensor& t) { return t.view({B * T, t.numel() / (B * T)}); };
  auto zero = [&](const Tensor& t) { device_.fill_zero(t.ptr, t.bytes()); };
  auto grad = [&](const std::string& name) { return grads_[index_.at(name)]; };
  const bool tied = !config_.untie_embeddings_and_output_weights;
  const Tensor& output_w = tied ? param("embedding.word_embeddings.weight") : param("output_layer.weight");
  const Tensor d_output_w = tied ? grad("embedding.word_embeddings.weight") : grad("output_layer.weight");

  // Loss: d(sum(loss * mask) * weight) / d loss = mask * weight.
  float* dl = acts_.d_losses.f32();
  const float* mask = batch.loss_mask.f32();
  for (int64_t i = 0; i < B * T; ++i) dl[i] = mask[i] * loss_weight;
  zero(acts_.d_logits);
  ops::cross_entropy_backward(rows(acts_.d_logits), acts_.d_losses.view({B * T}), rows(acts_.logits),
                              batch.labels.view({B * T}), acts_.losses.view({B * T}));
  zero(acts_.d_ln);
  ops::linear_backward(rows(acts_.d_ln), d_output_w, Tensor(), rows(acts_.d_logits), rows(acts_.lnf), output_w);
  zero(acts_.d_residual);
  ops::layernorm_backward(rows(acts_.d_residual), grad("decoder.final_layernorm.weight"),
                          grad("decoder.final_layernorm.bias"), rows(acts_.d_ln), rows(acts_.residual_out),
                          param("decoder.final_layernorm.weight"), acts_.lnf_mean.view({B * T}),
                          acts_.lnf_rstd.view({B * T}));
  // The final LayerNorm (and an untied output layer) follow the last layer's parameters.
  ready(layer_ranges_.back().second, specs_.size());

  // d_residual carries dL/d(output of layer l); the identity path of each residual add
  // leaves it in place while the branch gradients are added to it.
  for (int l = config_.num_layers - 1; l >= 0; --l) {
    LayerActs& a = acts_.layers[l];
    const LayerParams& w = layer_params_[l];
    const LayerParams& g = layer_grads_[l];
    // MLP branch.
    zero(acts_.d_C);
    ops::dropout_backward(acts_.d_C, acts_.d_residual, dropout(config_.hidden_dropout, layer_site(l, kAfterMlp), step));
    zero(acts_.d_gelu);
    ops::linear_backward(rows(acts_.d_gelu), g.fc2_w, g.fc2_b, rows(acts_.d_C), rows(a.gelu), w.fc2_w);
    zero(acts_.d_F);
    ops::gelu_backward(acts_.d_F, acts_.d_gelu, a.fc1, config_.gelu);
    zero(acts_.d_ln);
    ops::linear_backward(rows(acts_.d_ln), g.fc1_w, g.fc1_b, rows(acts_.d_F), rows(a.ln2), w.fc1_w);
    ops::layernorm_backward(rows(acts_.d_residual), g.ln2_w, g.ln2_b, rows(acts_.d_ln), rows(a.residual_mid), w.ln2_w,
                            a.ln2_mean.view({B * T}), a.ln2_rstd.view({B * T}));
    // Attention branch.
    zero(acts_.d_C);
    ops::dropout_backward(acts_.d_C, acts_.d_residual,
                          dropout(config_.hidden_dropout, layer_site(l, kAfterAttention), step));
    zero(acts_.d_ctx);
    ops::linear_backward(rows(acts_.d_ctx), g.proj_w, g.proj_b, rows(acts_.d_C), rows(a.ctx), w.proj_w);
    zero(acts_.d_qkv);
    ops::attention_backward(acts_.d_qkv, acts_.d_att, acts_.d_ctx, a.qkv, a.att,
                            dropout(config_.attention_dropout, layer_site(l, kAttentionProbs), step));
    zero(acts_.d_ln);
    ops::linear_backward(rows(acts_.d_ln), g.qkv_w, g.qkv_b, rows(acts_.d_qkv), rows(a.ln1), w.qkv_w);
    ops::layernorm_backward(rows(acts_.d_residual), g.ln1_w, g.ln1_b, rows(acts_.d_ln), rows(a.residual_in), w.ln1_w,
                            a.ln1_mean.view({B * T}), a.ln1_rstd.view({B * T}));
    ready(layer_ranges_[l].first, layer_ranges_[l].second);
  }
  zero(acts_.d_C);
  ops::dropout_backward(acts_.d_C, acts_.d_residual, dropout(config_.hidden_dropout, kEmbeddingSite, step));
  ops::embedding_backward(grad("embedding.word_embeddings.weight"), grad("embedding.position_embeddings.weight"),
                          acts_.d_C, batch.tokens, batch.positions);
  ready(0, layer_ranges_.front().first);
}

}  // namespace tessera
