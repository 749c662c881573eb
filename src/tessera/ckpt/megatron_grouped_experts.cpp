#include "tessera/ckpt/megatron_grouped_experts.h"

#include <algorithm>

#include "tessera/ckpt/checkpoint.h"
#include "tessera/ckpt/megatron_layer_spec.h"
#include "tessera/ckpt/torch_file.h"
#include "tessera/core/error.h"

namespace tessera {
namespace {

using pickle::Kind;
using pickle::TensorRef;
using pickle::Value;

constexpr std::string_view kExperts = "mlp.experts.";
constexpr std::string_view kSequential = "mlp.experts.local_experts.";
constexpr std::string_view kWeight1 = "mlp.experts.weight1", kWeight2 = "mlp.experts.weight2";

// The decimal number that is all of `s` (at most 6 digits); -1 otherwise.
int parse_index(std::string_view s) {
  if (s.empty() || s.size() > 6) return -1;
  int n = 0;
  for (char c : s) {
    if (c < '0' || c > '9') return -1;
    n = n * 10 + (c - '0');
  }
  return n;
}


// ---- Reading: GroupedMLP's tensors as per-expert views -----------------------------------------

// Expert j's SequentialMLP tensor inside GroupedMLP's weight1 [H, L*F1] (fc1: block j is
// linear_fc1.weight [F1, H] transposed) or weight2 [L*F, H] (block j is linear_fc2.weight [H, F]
// transposed): GroupedMLP.forward's view(L, H, -1) / view(L, -1, H), then the transpose its
// sharded_state_dict applies.
std::vector<TensorRef> expert_views(const TorchFile& f, const std::string& key, const TensorRef& t, bool fc1,
                                    int local_experts) {
  const int64_t L = local_experts;
  const bool contiguous = t.shape.size() == 2 && t.stride.size() == 2 && (t.shape[1] == 1 || t.stride[1] == 1) &&
                          (t.shape[0] == 1 || t.stride[0] == t.shape[1]);
  const int64_t grouped = t.shape.size() == 2 ? t.shape[fc1 ? 1 : 0] : 0;
  if (!contiguous || L < 1 || grouped % L != 0 || grouped == 0)
    throw runtime_error(f.path() + ": " + key + " " + shape_str(Shape(t.shape.begin(), t.shape.end())) +
                            " is not GroupedMLP's " + (fc1 ? "weight1 [H, E*F1]" : "weight2 [E*F, H]") +
                            " of a contiguous tensor over " + std::to_string(L) + " local experts",
                        "check the checkpoint's num_experts and expert_model_parallel_size args");
  const int64_t H = t.shape[fc1 ? 0 : 1], width = grouped / L;
  std::vector<TensorRef> views;
  for (int64_t j = 0; j < L; ++j) {
    TensorRef v = t;
    v.storage_offset = t.storage_offset + j * H * width;
    v.shape = fc1 ? std::vector<int64_t>{width, H} : std::vector<int64_t>{H, width};
    v.stride = fc1 ? std::vector<int64_t>{1, width} : std::vector<int64_t>{1, H};
    views.push_back(std::move(v));
  }
  return views;
}

Value* find(Value* dict, std::string_view key) {
  if (!dict || dict->kind != Kind::Dict) return nullptr;
  for (auto& [k, v] : dict->entries)
    if (k->is_str(key)) return v;
  return nullptr;
}

// One GroupedMLP tensor of the model: its place among Megatron's parameter groups (group g,
// position k), and which of the two it is.
struct Expansion {
  size_t group = 0, position = 0;
  bool fc1 = true;
};

// Assigns each model tensor its (group, position) as _get_param_groups orders them: groups by
// weight-decay class in order of first appearance, parameters in registration order.
class GroupPositions {
 public:
  std::pair<size_t, size_t> next(bool decays) {
    auto it = std::find(group_decays_.begin(), group_decays_.end(), decays);
    if (it == group_decays_.end()) {
      group_decays_.push_back(decays);
      counts_.push_back(0);
      it = group_decays_.end() - 1;
    }
    const size_t g = static_cast<size_t>(it - group_decays_.begin());
    return {g, counts_[g]++};
  }

 private:
  std::vector<bool> group_decays_;
  std::vector<size_t> counts_;
};

// The positions of the tensors in the one optimizer, or, when the file's optimizer is Megatron's
// chain of a dense and an expert optimizer (EP > 1: GroupedMLP's weights are allreduce=False),
// the GroupedMLP tensors' positions in the expert optimizer.
struct ChainPositions {
  bool chained = false;
  GroupPositions dense, expert;
};

// Replaces a model dict's GroupedMLP entries with per-expert views (recursing into nested
// dicts as the reader does), recording each one's group position.
void expand_model_dict(pickle::Document& doc, const TorchFile& f, Value& dict, const std::string& prefix, int depth,
                       int local_experts, ChainPositions& positions, std::vector<Expansion>& out) {
  if (depth > 8) return;  // the reader refuses it, naming the file
  std::vector<std::pair<Value*, Value*>> entries;
  for (auto& [k, v] : dict.entries) {
    const std::string key = k->kind == Kind::Str ? prefix + k->text : std::string();
    if (k->kind != Kind::Str || key.ends_with("_extra_state")) {
      entries.emplace_back(k, v);
      continue;
    }
    if (v->kind == Kind::Dict) expand_model_dict(doc, f, *v, key + ".", depth + 1, local_experts, positions, out);
    if (v->kind != Kind::Tensor) {
      entries.emplace_back(k, v);
      continue;
    }
    const bool fc1 = key.ends_with("." + std::string(kWeight1)), fc2 = key.ends_with("." + std::string(kWeight2));
    GroupPositions& mine = positions.chained && (fc1 || fc2) ? positions.expert : positions.dense;
    const auto [group, position] = mine.next(megatron_decays_weight(key, v->tensor.shape.size()));
    if (!fc1 && !fc2) {
      entries.emplace_back(k, v);
      continue;
    }
    out.push_back({group, position, fc1});
    const std::string layer = key.substr(0, key.size() - (fc1 ? kWeight1 : kWeight2).size());  // "decoder.layers.N."
    const std::vector<TensorRef> views = expert_views(f, key, v->tensor, fc1, local_experts);
    for (size_t j = 0; j < views.size(); ++j)
      entries.emplace_back(doc.str(layer + std::string(kSequential) + std::to_string(j) +
                                   (fc1 ? ".linear_fc1.weight" : ".linear_fc2.weight")),
                           doc.tensor(views[j]));
  }
  dict.entries = std::move(entries);
}

// The views of one optimizer tensor shaped like its GroupedMLP parameter.
std::vector<Value*> state_views(pickle::Document& doc, const TorchFile& f, const std::string& what, const Value* v,
                                bool fc1, int local_experts) {
  std::vector<Value*> out;
  for (const TensorRef& t : expert_views(f, what, v->tensor, fc1, local_experts)) out.push_back(doc.tensor(t));
  return out;
}

// torch's state of parameter `old_index` (a dict of its moments and `step`) as one entry per
// expert under `indices`, each moment a view.
void expand_parameter_state(pickle::Document& doc, const TorchFile& f, Value* state, int64_t old_index,
                            const std::vector<Value*>& indices, bool fc1) {
  const int local_experts = static_cast<int>(indices.size());
  const std::string what = "optimizer state of parameter " + std::to_string(old_index);
  for (size_t s = 0; s < state->entries.size(); ++s) {
    auto [key, st] = state->entries[s];
    if (key->kind != Kind::Int || key->integer != old_index || st->kind != Kind::Dict) continue;
    std::vector<Value*> per_expert;
    for (int j = 0; j < local_experts; ++j) per_expert.push_back(doc.dict());
    for (auto& [name, v] : st->entries) {
      if (v->kind != Kind::Tensor || v->tensor.shape.empty()) {  // `step`: shared
        for (Value* d : per_expert) doc.set(d, name, v);
        continue;
      }
      const std::vector<Value*> views = state_views(doc, f, what, v, fc1, local_experts);
      for (int j = 0; j < local_experts; ++j) doc.set(per_expert[j], name, views[j]);
    }
    state->entries.erase(state->entries.begin() + static_cast<std::ptrdiff_t>(s));
    for (int j = 0; j < local_experts; ++j) state->entries.emplace_back(indices[j], per_expert[j]);
    return;
  }
}

// Item `position` of a list replaced by `items`.
void splice(Value* list, size_t position, const std::vector<Value*>& items) {
  list->items.erase(list->items.begin() + static_cast<std::ptrdiff_t>(position));
  list->items.insert(list->items.begin() + static_cast<std::ptrdiff_t>(position), items.begin(), items.end());
}

// torch's optimizer state of the expanded tensors: each GroupedMLP parameter's index in its
// group becomes local_experts fresh indices, its state and fp32 copy as many views.
void expand_optimizer(pickle::Document& doc, const TorchFile& f, Value* optimizer, std::vector<Expansion> expansions,
                      int local_experts) {
  Value* inner = find(optimizer, "optimizer");
  if (!inner) inner = optimizer;
  Value* groups = find(inner, "param_groups");
  Value* state = find(inner, "state");
  Value* fp32 = find(optimizer, "fp32_from_fp16_params");
  if (!groups || groups->kind != Kind::List || !state || state->kind != Kind::Dict) return;  // the reader says why
  int64_t next_index = 0;
  for (const Value* g : groups->items)
    if (const Value* params = g->get("params"); params && params->kind == Kind::List)
      for (const Value* i : params->items) next_index = std::max(next_index, i->integer + 1);
  // Later positions first, so that earlier ones keep their place in the lists.
  std::sort(expansions.begin(), expansions.end(), [](const Expansion& a, const Expansion& b) {
    return a.group != b.group ? a.group > b.group : a.position > b.position;
  });
  for (const Expansion& e : expansions) {
    Value* params = e.group < groups->items.size() ? find(groups->items[e.group], "params") : nullptr;
    // A group shorter than the model's: the reader names the mismatch.
    if (!params || params->kind != Kind::List || e.position >= params->items.size()) return;
    const int64_t old_index = params->items[e.position]->integer;
    std::vector<Value*> indices;
    for (int j = 0; j < local_experts; ++j) indices.push_back(doc.integer(next_index++));
    splice(params, e.position, indices);
    expand_parameter_state(doc, f, state, old_index, indices, e.fc1);
    Value* copies = fp32 && fp32->kind == Kind::List && e.group < fp32->items.size() ? fp32->items[e.group] : nullptr;
    if (copies && copies->kind == Kind::List && e.position < copies->items.size() &&
        copies->items[e.position]->kind == Kind::Tensor)
      splice(copies, e.position,
             state_views(doc, f, "fp32_from_fp16_params", copies->items[e.position], e.fc1, local_experts));
  }
}

// ---- Writing ----------------------------------------------------------------------------------

bool arg_true(const nlohmann::json& args, const char* name) {
  auto it = args.find(name);
  return it != args.end() && it->is_boolean() && it->get<bool>();
}

// A SequentialMLP expert parameter's parts: "decoder.layers.N.mlp.experts.local_experts.J.
// linear_fcX.weight" -> ("decoder.layers.N.", J, "linear_fcX", "weight").
struct ExpertName {
  std::string layer;
  int expert = -1;
  std::string linear, kind;
};

std::optional<ExpertName> expert_name(const std::string& name) {
  const size_t at = name.find(kSequential);
  if (at == std::string::npos) return std::nullopt;
  const size_t begin = at + kSequential.size(), dot = name.find('.', begin);
  if (dot == std::string::npos) return std::nullopt;
  const size_t last = name.rfind('.');
  if (last <= dot) return std::nullopt;
  ExpertName n{name.substr(0, at), parse_index(std::string_view(name).substr(begin, dot - begin)),
               name.substr(dot + 1, last - dot - 1), name.substr(last + 1)};
  if (n.expert < 0) return std::nullopt;
  return n;
}

// The experts' tensors [F1, H] (fc1; tessera's gated [2, F, H] is [gate; up] rows) or [H, F]
// (fc2) in GroupedMLP's storage order: block j the transpose of expert j's.
std::vector<float> grouped_values(const std::vector<Tensor>& experts, bool fc1) {
  std::vector<float> out;
  std::vector<float> host;
  for (const Tensor& t : experts) {
    const int64_t H = fc1 ? t.shape.back() : t.shape.front(), width = t.numel() / H;
    host.resize(static_cast<size_t>(t.numel()));
    read_tensor_bytes(t, host.data());
    const size_t base = out.size();
    out.resize(base + host.size());
    // fc1 [width, H] -> [H, width]; fc2 [H, width] -> [width, H].
    const int64_t rows = fc1 ? width : H, cols = fc1 ? H : width;
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < cols; ++c)
        out[base + static_cast<size_t>(c * rows + r)] = host[static_cast<size_t>(r * cols + c)];
  }
  return out;
}

// One layer's experts (a file's experts numbered from 0) as GroupedMLP's weight1 and weight2.
void add_grouped_mlp(const std::string& layer, const std::vector<const MegatronParam*>& experts,
                     GroupedMegatronParams& out) {
  for (const char* linear : {"linear_fc1", "linear_fc2"}) {
    std::vector<const MegatronParam*> mine;
    for (const MegatronParam* p : experts)
      if (expert_name(p->name)->linear == linear) mine.push_back(p);
    if (mine.empty()) continue;
    const bool fc1 = std::string(linear) == "linear_fc1";
    const int64_t H = fc1 ? mine[0]->value.shape.back() : mine[0]->value.shape.front();
    const int64_t width = mine[0]->value.numel() / H, L = static_cast<int64_t>(mine.size());
    auto grouped = [&](const std::vector<Tensor>& tensors) {
      out.storage.push_back(grouped_values(tensors, fc1));
      return Tensor(out.storage.back().data(), DType::F32, fc1 ? Shape{H, L * width} : Shape{L * width, H}, nullptr);
    };
    MegatronParam g{layer + std::string(fc1 ? kWeight1 : kWeight2), {}, mine[0]->weight_decay, {}, mine[0]->chunk};
    g.expert_parallel = mine[0]->expert_parallel;  // the expert optimizer's at EP > 1, as each expert's
    std::vector<Tensor> values;
    for (const MegatronParam* p : mine) values.push_back(p->value);
    g.value = grouped(values);
    for (size_t k = 0; k < mine[0]->state.size(); ++k) {
      std::vector<Tensor> kind;
      for (const MegatronParam* p : mine) kind.push_back(p->state.at(k).second);
      g.state.emplace_back(mine[0]->state[k].first, grouped(kind));
    }
    out.params.push_back(std::move(g));
  }
}

// One layer's experts under TEGroupedMLP's names: linear_fc1's weight<j> for every expert, then
// linear_fc2's (SequentialMLP's shapes, tessera's gated [2, F, H] as Megatron's [2F, H]).
void add_te_grouped_mlp(const std::string& layer, const std::vector<const MegatronParam*>& experts,
                        GroupedMegatronParams& out) {
  for (const char* linear : {"linear_fc1", "linear_fc2"})
    for (const MegatronParam* p : experts) {
      const ExpertName n = *expert_name(p->name);
      if (n.linear != linear) continue;
      MegatronParam te = *p;
      te.name = layer + std::string(kExperts) + linear + "." + n.kind + std::to_string(n.expert);
      if (te.value.shape.size() == 3) {
        const Shape flat{te.value.shape[0] * te.value.shape[1], te.value.shape[2]};
        te.value = te.value.view(flat);
        for (auto& [kind, t] : te.state) t = t.view(flat);
      }
      out.params.push_back(std::move(te));
    }
}

}  // namespace

std::optional<std::string> sequential_name_of_te_grouped(const std::string& rest) {
  for (const char* linear : {"linear_fc1.", "linear_fc2."})
    for (const char* kind : {"weight", "bias"}) {
      const std::string prefix = std::string(kExperts) + linear + kind;
      if (rest.rfind(prefix, 0) != 0) continue;
      const int j = parse_index(std::string_view(rest).substr(prefix.size()));
      if (j < 0) return std::nullopt;
      return std::string(kSequential) + std::to_string(j) + "." + linear + kind;
    }
  return std::nullopt;
}

bool is_grouped_mlp_weight(const std::string& rest) { return rest == kWeight1 || rest == kWeight2; }

bool megatron_decays_weight(const std::string& key, size_t dims) { return !key.ends_with(".bias") && dims != 1; }

bool expand_grouped_mlp_weights(TorchFile& f, int local_experts) {
  pickle::Document& doc = f.document();
  Value* root = doc.root;
  Value* optimizer = find(root, "optimizer");
  ChainPositions positions;
  positions.chained = optimizer && optimizer->kind == Kind::List;
  std::vector<Expansion> expansions;
  // The model's state dict, or one per virtual pipeline chunk (as the reader takes them).
  std::vector<Value*> chunks;
  for (int c = 0; Value* m = find(root, "model" + std::to_string(c)); ++c) chunks.push_back(m);
  if (chunks.empty()) chunks.push_back(find(root, "model"));
  for (Value* model : chunks)
    if (model && model->kind == Kind::Dict)
      expand_model_dict(doc, f, *model, "", 0, local_experts, positions, expansions);
  if (expansions.empty()) return false;
  // A chain whose shape is wrong is left to the optimizer reader, which names the mismatch.
  if (positions.chained && optimizer->items.size() == 2 && optimizer->items[1]->kind == Kind::Dict)
    expand_optimizer(doc, f, optimizer->items[1], expansions, local_experts);
  else if (optimizer && optimizer->kind == Kind::Dict)
    expand_optimizer(doc, f, optimizer, expansions, local_experts);
  return true;
}

GroupedMegatronParams group_megatron_experts(const nlohmann::json& args, const std::vector<MegatronParam>& params) {
  GroupedMegatronParams out;
  if (!arg_true(args, "moe_grouped_gemm")) {
    out.params = params;
    return out;
  }
  const bool te = megatron_uses_transformer_engine(args);
  for (size_t i = 0; i < params.size();) {
    const std::optional<ExpertName> first = expert_name(params[i].name);
    if (!first) {
      out.params.push_back(params[i++]);
      continue;
    }
    // The layer's experts are consecutive (MoELayer registers its router, experts, shared experts).
    std::vector<const MegatronParam*> experts;
    for (const int chunk = params[i].chunk; i < params.size(); ++i) {
      const std::optional<ExpertName> n = expert_name(params[i].name);
      if (!n || n->layer != first->layer || params[i].chunk != chunk) break;
      if (n->kind != "weight")
        throw runtime_error("expert parameter " + params[i].name + " has no place in megatron-core's GroupedMLP",
                            "save with --disable-bias-linear, or without --moe-grouped-gemm");
      experts.push_back(&params[i]);
    }
    if (te)
      add_te_grouped_mlp(first->layer, experts, out);
    else
      add_grouped_mlp(first->layer, experts, out);
  }
  return out;
}

}  // namespace tessera
