#include "tessera/ckpt/hf_moe.h"

#include <algorithm>

#include "tessera/core/error.h"

namespace tessera {
namespace {

using json = nlohmann::json;

// Qwen2-MoE's list of layers without experts, as MoE flags: a layer l is sparse when it is not
// in mlp_only_layers and (l + 1) % decoder_sparse_step == 0 (Qwen2MoeDecoderLayer).
std::vector<bool> qwen2_moe_layers(const HFConfigFile& j, int64_t layers) {
  const int64_t step = j.integer("decoder_sparse_step", 1);
  std::vector<bool> moe(static_cast<size_t>(layers));
  for (int64_t l = 0; l < layers; ++l) moe[l] = (l + 1) % step == 0;
  if (auto it = j.json().find("mlp_only_layers"); it != j.json().end() && it->is_array())
    for (const json& l : *it)
      if (l.is_number_integer() && l.get<int64_t>() >= 0 && l.get<int64_t>() < layers) moe[l.get<int64_t>()] = false;
  return moe;
}

std::string layer_list(const std::vector<bool>& layers) {
  std::string s = "[";
  for (size_t l = 0; l < layers.size(); ++l) s += std::string(l ? "," : "") + (layers[l] ? "1" : "0");
  return s + "]";
}

// HF names of one expert's (or the shared expert's) three projections: gate, up, down.
struct Projections {
  std::string gate, up, down;
};
Projections expert_names(HFFamily family, const std::string& hp, int e) {
  if (family == HFFamily::Mixtral) {
    const std::string p = hp + "block_sparse_moe.experts." + std::to_string(e) + ".";
    return {p + "w1.weight", p + "w3.weight", p + "w2.weight"};
  }
  const std::string p = e < 0 ? hp + "mlp.shared_expert." : hp + "mlp.experts." + std::to_string(e) + ".";
  return {p + "gate_proj.weight", p + "up_proj.weight", p + "down_proj.weight"};
}

std::string router_name(HFFamily family, const std::string& hp) {
  return hp + (family == HFFamily::Mixtral ? "block_sparse_moe.gate.weight" : "mlp.gate.weight");
}

}  // namespace

bool is_hf_moe_family(HFFamily f) { return f == HFFamily::Mixtral || f == HFFamily::Qwen2Moe; }

HFMoEShape parse_hf_moe(const HFConfigFile& j, HFFamily family, int64_t layers) {
  HFMoEShape h;
  if (family == HFFamily::Mixtral) {
    h.experts = j.integer("num_local_experts", 8);
    h.topk = j.integer("num_experts_per_tok", 2);
    h.ffn = j.integer("intermediate_size");
    h.moe_layers.assign(static_cast<size_t>(layers), true);
    if (j.number("router_jitter_noise", 0.0) != 0.0)
      j.unsupported("router_jitter_noise", "but tessera's router adds no noise", "only models without jitter convert");
  } else {
    h.experts = j.integer("num_experts", 60);
    h.topk = j.integer("num_experts_per_tok", 4);
    h.ffn = j.integer("moe_intermediate_size", 1408);
    h.shared_ffn = j.integer("shared_expert_intermediate_size", 5632);
    h.pre_softmax = !j.boolean("norm_topk_prob", false);
    h.moe_layers = qwen2_moe_layers(j, layers);
  }
  return h;
}

void check_hf_moe(HFFlagCheck& check, const HFMoEShape& h, HFFamily family, const GPTConfig& c) {
  const MoEConfig& m = c.moe;
  check.equal(family == HFFamily::Mixtral ? "num_local_experts" : "num_experts", h.experts, "--num-experts",
              m.num_experts);
  if (!m.enabled()) return;
  check.equal("num_experts_per_tok", h.topk, "--moe-router-topk", m.topk);
  check.equal(family == HFFamily::Mixtral ? "intermediate_size" : "moe_intermediate_size", h.ffn,
              "--moe-ffn-hidden-size", m.ffn_hidden_size);
  if (h.pre_softmax != m.pre_softmax)
    check.differ(h.pre_softmax ? "the model routes by the top-k of the softmax (norm_topk_prob false) but "
                                 "--moe-router-pre-softmax is not given"
                               : "the model routes by the softmax of the top-k logits but --moe-router-pre-softmax "
                                 "is given",
                 h.pre_softmax ? "pass --moe-router-pre-softmax" : "drop --moe-router-pre-softmax");
  check.equal("shared_expert_intermediate_size", h.shared_ffn, "--moe-shared-expert-intermediate-size",
              m.shared_expert_size);
  if (h.shared_ffn > 0 && !m.shared_expert_gate)
    check.differ("the shared experts have Qwen2-MoE's sigmoid gate but --moe-shared-expert-gate is not given",
                 "pass --moe-shared-expert-gate");
  if (h.moe_layers != m.moe_layers)
    check.differ("the MoE layers " + layer_list(h.moe_layers) + " (decoder_sparse_step, mlp_only_layers) differ from "
                 "--moe-layer-freq's " + layer_list(m.moe_layers),
                 "pass --moe-layer-freq " + layer_list(h.moe_layers));
}

void load_hf_moe_mlp(std::map<std::string, std::vector<float>>& out, HFWeights& f, HFFamily family,
                     const std::string& hp, const std::string& mp, const GPTConfig& c) {
  const int64_t H = c.hidden_size;
  auto mlp = [&](const Projections& p, const std::string& prefix, int64_t F) {
    std::vector<float> fc1 = f.get(p.gate, {F, H}, prefix + "linear_fc1.weight");
    const std::vector<float> up = f.get(p.up, {F, H}, prefix + "linear_fc1.weight");
    fc1.insert(fc1.end(), up.begin(), up.end());
    out[prefix + "linear_fc1.weight"] = std::move(fc1);
    out[prefix + "linear_fc2.weight"] = f.get(p.down, {H, F}, prefix + "linear_fc2.weight");
  };
  out[mp + "mlp.router.weight"] = f.get(router_name(family, hp), {c.moe.num_experts, H}, mp + "mlp.router.weight");
  for (int e = 0; e < c.moe.num_experts; ++e)
    mlp(expert_names(family, hp, e), mp + "mlp.experts.local_experts." + std::to_string(e) + ".",
        c.moe.ffn_hidden_size);
  if (c.moe.shared_expert_size > 0) {
    mlp(expert_names(family, hp, -1), mp + "mlp.shared_experts.", c.moe.shared_expert_size);
    out[mp + "mlp.shared_experts.gate_weight"] =
        f.get(hp + "mlp.shared_expert_gate.weight", {1, H}, mp + "mlp.shared_experts.gate_weight");
  }
}

void hf_moe_mlp_tensors(std::vector<HFTensor>& out, const std::map<std::string, std::vector<float>>& w,
                        HFFamily family, const std::string& hp, const std::string& mp, const GPTConfig& c) {
  const int64_t H = c.hidden_size;
  auto mlp = [&](const Projections& p, const std::string& prefix, int64_t F) {
    const std::vector<float>& fc1 = checkpoint_param(w, prefix + "linear_fc1.weight", 2 * F * H);
    out.push_back({p.gate, {F, H}, std::vector<float>(fc1.begin(), fc1.begin() + F * H)});
    out.push_back({p.up, {F, H}, std::vector<float>(fc1.begin() + F * H, fc1.end())});
    out.push_back({p.down, {H, F}, checkpoint_param(w, prefix + "linear_fc2.weight", H * F)});
  };
  const int64_t E = c.moe.num_experts;
  out.push_back({router_name(family, hp), {E, H}, checkpoint_param(w, mp + "mlp.router.weight", E * H)});
  for (int e = 0; e < E; ++e)
    mlp(expert_names(family, hp, e), mp + "mlp.experts.local_experts." + std::to_string(e) + ".",
        c.moe.ffn_hidden_size);
  if (c.moe.shared_expert_size > 0) {
    mlp(expert_names(family, hp, -1), mp + "mlp.shared_experts.", c.moe.shared_expert_size);
    out.push_back({hp + "mlp.shared_expert_gate.weight", {1, H},
                   checkpoint_param(w, mp + "mlp.shared_experts.gate_weight", H)});
  }
}

HFFamily check_hf_moe_expressible(const GPTConfig& c) {
  const MoEConfig& m = c.moe;
  const bool qwen = m.shared_expert_size > 0 || c.add_qkv_bias;
  auto inexpressible = [&](const std::string& what, const std::string& hint) {
    throw usage_error(std::string("export-hf: ") + what + "; " + (qwen ? "Qwen2MoeForCausalLM" : "MixtralForCausalLM") +
                          " cannot express it",
                      hint);
  };
  if (!c.swiglu) inexpressible("the experts are not SwiGLU", "train with --swiglu");
  if (m.capacity_factor > 0) inexpressible("the experts drop tokens (--moe-expert-capacity-factor)",
                                           "train without --moe-expert-capacity-factor");
  if (!qwen) {
    if (m.pre_softmax) inexpressible("the router takes the top-k of the softmax", "train without --moe-router-pre-softmax");
    if (std::find(m.moe_layers.begin(), m.moe_layers.end(), false) != m.moe_layers.end())
      inexpressible("some layers are dense (--moe-layer-freq)", "train with --moe-layer-freq 1");
    return HFFamily::Mixtral;
  }
  if (!c.add_qkv_bias) inexpressible("linear_qkv has no bias", "train with --add-qkv-bias");
  if (m.shared_expert_size == 0 || !m.shared_expert_gate)
    inexpressible("the model has no gated shared experts",
                  "train with --moe-shared-expert-intermediate-size and --moe-shared-expert-gate");
  return HFFamily::Qwen2Moe;
}

void write_hf_moe_config(json& j, HFFamily family, const GPTConfig& c) {
  const MoEConfig& m = c.moe;
  j["num_experts_per_tok"] = m.topk;
  j["output_router_logits"] = false;
  if (family == HFFamily::Mixtral) {
    j["num_local_experts"] = m.num_experts;
    j["intermediate_size"] = m.ffn_hidden_size;
    j["router_aux_loss_coef"] = m.aux_loss_coeff;
    j["router_jitter_noise"] = 0.0;
    j["sliding_window"] = nullptr;
    return;
  }
  j["num_experts"] = m.num_experts;
  j["moe_intermediate_size"] = m.ffn_hidden_size;
  j["shared_expert_intermediate_size"] = m.shared_expert_size;
  j["norm_topk_prob"] = !m.pre_softmax;
  j["router_aux_loss_coef"] = m.aux_loss_coeff;
  j["decoder_sparse_step"] = 1;
  json dense = json::array();
  for (size_t l = 0; l < m.moe_layers.size(); ++l)
    if (!m.moe_layers[l]) dense.push_back(l);
  j["mlp_only_layers"] = dense;
}

std::vector<std::string> hf_moe_train_flags(const HFMoEShape& h) {
  std::vector<std::string> f = {"--num-experts", std::to_string(h.experts), "--moe-router-topk",
                                std::to_string(h.topk), "--moe-ffn-hidden-size", std::to_string(h.ffn)};
  if (h.pre_softmax) f.push_back("--moe-router-pre-softmax");
  if (h.shared_ffn > 0)
    f.insert(f.end(), {"--moe-shared-expert-intermediate-size", std::to_string(h.shared_ffn), "--moe-shared-expert-gate"});
  if (std::find(h.moe_layers.begin(), h.moe_layers.end(), false) != h.moe_layers.end())
    f.insert(f.end(), {"--moe-layer-freq", layer_list(h.moe_layers)});
  return f;
}

}  // namespace tessera
