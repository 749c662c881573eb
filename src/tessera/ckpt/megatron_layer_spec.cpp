#include "tessera/ckpt/megatron_layer_spec.h"

#include <algorithm>
#include <optional>
#include <set>
#include <string_view>

#include "tessera/ckpt/megatron_values.h"
#include "tessera/ckpt/torch_file.h"

namespace tessera {
namespace {


constexpr std::string_view kLayers = "decoder.layers.";
constexpr std::string_view kInputNorm = "input_layernorm.", kMlpNorm = "pre_mlp_layernorm.";

// A name as its layer's prefix ("decoder.layers.3.", empty outside the layers) and the rest.
struct LayerName {
  std::string layer, rest;
};
LayerName split_layer(const std::string& name) {
  const size_t dot = name.starts_with(kLayers) ? name.find('.', kLayers.size()) : std::string::npos;
  if (dot == std::string::npos) return {"", name};
  return {name.substr(0, dot + 1), name.substr(dot + 1)};
}

// Whether a layer holds an MoE block (its router), whose pre_mlp_layernorm Transformer Engine's
// spec keeps as a TENorm instead of fusing it.
bool is_moe_layer(const std::vector<std::string>& rests) {
  return std::any_of(rests.begin(), rests.end(), [](const std::string& r) { return r.starts_with("mlp.router."); });
}

// Where a layer's parameter falls in Transformer Engine's registration order: SelfAttention
// builds linear_proj (in Attention) before linear_qkv, which holds the input norm.
size_t te_position(const std::string& rest) {
  static constexpr std::string_view kOrder[] = {"self_attention.linear_proj.", kInputNorm, "self_attention.", kMlpNorm,
                                                "mlp."};
  for (size_t i = 0; i < std::size(kOrder); ++i)
    if (rest.starts_with(kOrder[i])) return i;
  return std::size(kOrder);
}

std::string te_rest(const std::string& rest, bool moe_layer) {
  if (rest.starts_with(kInputNorm))
    return "self_attention.linear_qkv.layer_norm_" + rest.substr(kInputNorm.size());
  if (!moe_layer && rest.starts_with(kMlpNorm)) return "mlp.linear_fc1.layer_norm_" + rest.substr(kMlpNorm.size());
  return rest;
}

std::string module_of(const std::string& name) { return name.substr(0, name.rfind('.')); }

bool is_linear_module(const std::string& module) {
  for (const char* m : {".linear_qkv", ".linear_proj", ".linear_fc1", ".linear_fc2"})
    if (module.ends_with(m)) return true;
  return false;
}

// The extra state a module other than output_layer ends with; nullopt for none.
std::optional<MegatronExtraState> extra_state_of(bool te, const std::string& module) {
  if (is_linear_module(module))
    return te && module.find(".mlp.experts.local_experts.") == std::string::npos
               ? MegatronExtraState::TransformerEngineModule
               : MegatronExtraState::None;
  if (te && (module == "decoder.final_layernorm" || module.ends_with(".pre_mlp_layernorm")))
    return MegatronExtraState::TransformerEngineNorm;
  return std::nullopt;
}

}  // namespace

bool megatron_uses_transformer_engine(const nlohmann::json& args) {
  const auto impl = args.find("transformer_impl");
  return impl != args.end() && impl->is_string() && impl->get<std::string>() == "transformer_engine";
}

pickle::Value* megatron_extra_state_value(pickle::Document& doc, megatron::FileTensors& tensors,
                                          MegatronExtraState extra) {
  switch (extra) {
    case MegatronExtraState::None: return doc.none();
    case MegatronExtraState::TransformerEngineNorm: return tensors.empty();
    case MegatronExtraState::TransformerEngineModule: break;
  }
  // io.BytesIO's pickled state: its contents, the position torch.save left it at (the end), no
  // attributes.
  static const std::vector<uint8_t> saved_none = [] {
    pickle::Document none;
    none.root = none.none();
    return torch_file_bytes("archive", *none.root, {});
  }();
  pickle::Value* contents = doc.make(pickle::Kind::Bytes);
  contents->text.assign(saved_none.begin(), saved_none.end());
  pickle::Value* buffer = doc.object("_io.BytesIO");
  buffer->state = doc.tuple({contents, doc.integer(static_cast<int64_t>(saved_none.size())), doc.none()});
  return buffer;
}

std::vector<MegatronParam> megatron_spec_params(const nlohmann::json& args, const std::vector<MegatronParam>& params) {
  if (!megatron_uses_transformer_engine(args)) return params;
  std::vector<MegatronParam> out;
  for (size_t begin = 0; begin < params.size();) {
    // One layer of one chunk: its parameters are consecutive.
    const LayerName first = split_layer(params[begin].name);
    size_t end = begin + 1;
    while (end < params.size() && !first.layer.empty() && params[end].chunk == params[begin].chunk &&
           split_layer(params[end].name).layer == first.layer)
      ++end;
    std::vector<std::string> rests;
    for (size_t i = begin; i < end; ++i) rests.push_back(split_layer(params[i].name).rest);
    const bool moe = is_moe_layer(rests);
    const size_t first_out = out.size();
    for (size_t i = begin; i < end; ++i) {
      out.push_back(params[i]);
      if (!first.layer.empty()) out.back().name = first.layer + te_rest(rests[i - begin], moe);
    }
    std::stable_sort(out.begin() + static_cast<std::ptrdiff_t>(first_out), out.end(),
                     [](const MegatronParam& a, const MegatronParam& b) {
                       return te_position(split_layer(a.name).rest) < te_position(split_layer(b.name).rest);
                     });
    begin = end;
  }
  return out;
}

std::vector<MegatronModelEntry> megatron_model_entries(bool te, const std::vector<std::string>& names,
                                                      bool with_output_layer) {
  std::vector<MegatronModelEntry> out;
  for (size_t i = 0; i < names.size(); ++i) {
    const std::string module = module_of(names[i]);
    const bool starts = i == 0 || module_of(names[i - 1]) != module;
    // Transformer Engine's DotProductAttention, registered before linear_proj, has no parameters.
    if (te && starts && module.ends_with(".self_attention.linear_proj"))
      out.push_back({-1, module.substr(0, module.size() - std::string_view("linear_proj").size()) +
                             "core_attention._extra_state",
                     MegatronExtraState::TransformerEngineModule});
    out.push_back({static_cast<int>(i), "", MegatronExtraState::None});
    const bool ends = i + 1 == names.size() || module_of(names[i + 1]) != module;
    if (!ends || module == "output_layer") continue;
    if (const std::optional<MegatronExtraState> extra = extra_state_of(te, module))
      out.push_back({-1, module + "._extra_state", *extra});
  }
  if (with_output_layer) out.push_back({-1, "output_layer._extra_state", MegatronExtraState::None});
  return out;
}

std::vector<std::pair<std::string, MegatronExtraState>> torch_dist_extra_states(bool te,
                                                                               const std::vector<std::string>& names) {
  std::set<std::string> moe_layers;
  for (const std::string& n : names)
    if (const LayerName l = split_layer(n); !l.layer.empty() && l.rest.starts_with("mlp.router."))
      moe_layers.insert(l.layer);
  std::vector<std::pair<std::string, MegatronExtraState>> out;
  for (const std::string& name : names) {
    if (!name.ends_with(".weight")) continue;
    const LayerName l = split_layer(name);
    const std::string module = module_of(name);
    if (!l.layer.empty() && is_linear_module(module)) {
      if (te && l.rest == "self_attention.linear_proj.weight")
        out.emplace_back(l.layer + "self_attention.core_attention.weight", MegatronExtraState::TransformerEngineModule);
      out.emplace_back(name, *extra_state_of(te, module));
    } else if (te && (name == "decoder.final_layernorm.weight" ||
                      (moe_layers.count(l.layer) && l.rest == std::string(kMlpNorm) + "weight"))) {
      out.emplace_back(name, MegatronExtraState::TransformerEngineNorm);
    }
  }
  return out;
}

}  // namespace tessera
