#include "tessera/ckpt/megatron_checkpoint.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <deque>
#include <filesystem>
#include <functional>
#include <map>
#include <optional>
#include <set>

#include "tessera/ckpt/megatron_distrib_optim.h"
#include "tessera/ckpt/megatron_grouped_experts.h"
#include "tessera/ckpt/megatron_layer_spec.h"
#include "tessera/ckpt/megatron_optimizer_state.h"
#include "tessera/ckpt/megatron_rng_state.h"
#include "tessera/ckpt/megatron_values.h"
#include "tessera/ckpt/torch_file.h"
#include "tessera/core/dtype.h"
#include "tessera/core/error.h"
#include "tessera/core/file_io.h"

namespace tessera {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using megatron::arg_int;
using megatron::as_int;
using megatron::as_number;
using megatron::FileTensors;
using megatron::from_json;
using megatron::need;
using megatron::to_json;
using pickle::Kind;
using pickle::Value;

// ---- Names ----------------------------------------------------------------------------------
// Megatron's state-dict names -> tessera's (mcore, local spec). Llama-family checkpoints use
// the same mcore names (linear_fc1 holds [gate; up]); their extra rules belong here.

struct Rename {
  const char* from;
  const char* to;
};

// Whole names outside the layers.
constexpr Rename kTopLevel[] = {
    {"language_model.embedding.word_embeddings.weight", "embedding.word_embeddings.weight"},
    {"language_model.embedding.position_embeddings.weight", "embedding.position_embeddings.weight"},
    {"language_model.encoder.final_norm.weight", "decoder.final_layernorm.weight"},
    {"language_model.encoder.final_norm.bias", "decoder.final_layernorm.bias"},
    {"language_model.encoder.final_layernorm.weight", "decoder.final_layernorm.weight"},
    {"language_model.encoder.final_layernorm.bias", "decoder.final_layernorm.bias"},
    {"language_model.output_layer.weight", "output_layer.weight"},
    {"word_embeddings_for_head.weight", "output_layer.weight"},
};

// The part of a layer's name after "layers.N.": exact names first (Transformer Engine's norms
// fused into the next linear layer), then module prefixes (legacy names).
constexpr Rename kLayerExact[] = {
    {"self_attention.linear_qkv.layer_norm_weight", "input_layernorm.weight"},
    {"self_attention.linear_qkv.layer_norm_bias", "input_layernorm.bias"},
    {"mlp.linear_fc1.layer_norm_weight", "pre_mlp_layernorm.weight"},
    {"mlp.linear_fc1.layer_norm_bias", "pre_mlp_layernorm.bias"},
};
constexpr Rename kLayerPrefix[] = {
    {"input_norm.", "input_layernorm."},
    {"post_attention_norm.", "pre_mlp_layernorm."},
    {"post_attention_layernorm.", "pre_mlp_layernorm."},
    {"self_attention.query_key_value.", "self_attention.linear_qkv."},
    {"self_attention.dense.", "self_attention.linear_proj."},
    {"mlp.dense_h_to_4h.", "mlp.linear_fc1."},
    {"mlp.dense_4h_to_h.", "mlp.linear_fc2."},
};
constexpr const char* kLayerRoots[] = {"decoder.layers.", "language_model.encoder.layers."};


// A state-dict key split into its stage-local layer number (-1 outside the layers) and the
// tessera name of the rest; nullopt for entries that hold no parameter (_extra_state).
struct MappedName {
  int local_layer = -1;
  std::string rest;  // after "decoder.layers.N." for layers, else the whole tessera name
};

std::optional<MappedName> map_name(const std::string& key) {
  if (key.ends_with("_extra_state")) return std::nullopt;
  for (const Rename& r : kTopLevel)
    if (key == r.from) return MappedName{-1, r.to};
  for (const char* root : kLayerRoots) {
    if (!key.starts_with(root)) continue;
    const size_t num_begin = std::strlen(root), dot = key.find('.', num_begin);
    if (dot == std::string::npos || dot == num_begin || dot - num_begin > 6) return MappedName{-1, key};
    int layer = 0;
    for (size_t i = num_begin; i < dot; ++i) {
      if (key[i] < '0' || key[i] > '9') return MappedName{-1, key};
      layer = layer * 10 + (key[i] - '0');
    }
    std::string rest = key.substr(dot + 1);
    for (const Rename& r : kLayerExact)
      if (rest == r.from) return MappedName{layer, r.to};
    for (const Rename& r : kLayerPrefix)
      if (rest.starts_with(r.from)) return MappedName{layer, r.to + rest.substr(std::strlen(r.from))};
    if (std::optional<std::string> expert = sequential_name_of_te_grouped(rest)) return MappedName{layer, *expert};
    return MappedName{layer, rest};
  }
  return MappedName{-1, key};
}

}  // namespace

std::optional<std::pair<int, std::string>> map_megatron_name(const std::string& key) {
  const std::optional<MappedName> m = map_name(key);
  if (!m) return std::nullopt;
  return std::pair{m->local_layer, m->rest};
}

namespace {

std::string global_name(const MappedName& m, int first_layer) {
  return m.local_layer < 0 ? m.rest : "decoder.layers." + std::to_string(first_layer + m.local_layer) + "." + m.rest;
}

// The dimension a parameter is split along over TP ranks (megatron/core/tensor_parallel/
// layers.py: ColumnParallelLinear and VocabParallelEmbedding split rows, RowParallelLinear
// columns), -1 for replicated ones (norms, the MoE router, the shared experts' gate). Every
// MLP's fc1 and fc2 split alike: the dense MLP's, each expert's (expert TP = TP) and the shared
// experts'.
int split_dim_of(const std::string& name) {
  if (name == "embedding.word_embeddings.weight" || name == "output_layer.weight") return 0;
  for (const char* column : {"self_attention.linear_qkv.weight", "self_attention.linear_qkv.bias",
                             ".linear_fc1.weight", ".linear_fc1.bias"})
    if (name.ends_with(column)) return 0;
  for (const char* row : {"self_attention.linear_proj.weight", ".linear_fc2.weight"})
    if (name.ends_with(row)) return 1;
  return -1;
}

// SwiGLU's linear_fc1 is [2, F, H] in tessera (gate rows, then up rows; bias [2, F]); a
// Megatron rank saves its [gate_r; up_r] as one [2F/TP, H] (bias [2F/TP]).
bool is_gated_fc1(const std::string& name, size_t dims) {
  return (name.ends_with(".linear_fc1.weight") && dims == 3) || (name.ends_with(".linear_fc1.bias") && dims == 2);
}

// SequentialMLP's experts (megatron/core/transformer/moe/experts.py): the file of
// expert-parallel rank r holds experts r*L .. r*L+L-1 of a layer as local_experts.0 .. L-1,
// its other parameters being replicas of every rank's.
constexpr std::string_view kLocalExperts = "mlp.experts.local_experts.";

bool is_expert(const std::string& rest) { return rest.starts_with(kLocalExperts); }

// A layer's name (after "decoder.layers.N.") with its expert renumbered by `shift`; other
// names unchanged.
std::string shift_expert(const std::string& rest, int shift) {
  if (!is_expert(rest)) return rest;
  const size_t begin = kLocalExperts.size(), dot = rest.find('.', begin);
  int expert = 0;
  for (size_t i = begin; i < dot && i < rest.size(); ++i) {
    if (rest[i] < '0' || rest[i] > '9' || i - begin > 6) return rest;
    expert = expert * 10 + (rest[i] - '0');
  }
  if (dot == std::string::npos || dot == begin) return rest;
  return std::string(kLocalExperts) + std::to_string(expert + shift) + rest.substr(dot);
}
Shape megatron_shape(const std::string& name, Shape shape) {
  if (!is_gated_fc1(name, shape.size())) return shape;
  shape[1] *= shape[0];
  shape.erase(shape.begin());
  return shape;
}

// ---- One file -------------------------------------------------------------------------------

struct SavedParam {
  std::string key;   // as saved
  MappedName mapped;
  const Value* tensor;
  bool weight_decay;
  int chunk = 0;  // its virtual pipeline chunk (`model<chunk>`); 0 for `model`
  bool replica = false;  // in the file of an EP rank above 0, a parameter other than its experts
                         // (EP rank 0's file gives it)
};

struct RankFile {
  int tp = 0, pp = 0, ep = 0;
  std::string rel;
  TorchFile file;
  std::vector<SavedParam> params;  // registration order, chunk by chunk (the optimizer's order)
  std::vector<int> first_layer;    // of each of its chunks, globally
  bool grouped = false;            // its GroupedMLP tensors were expanded into per-expert views
};

// A saved layout: tensor-, pipeline- and expert-parallel sizes, and each layer's experts per
// expert-parallel rank.
struct SavedLayout {
  int tp = 1, pp = 1, ep = 1;
  int local_experts = 0;
};

std::string shard_rel(int tp, int pp, int ep, const SavedLayout& l) {
  return megatron_shard_folder(tp, pp, l.pp, ep, l.ep) + "/" + kMegatronFile;
}

// An experts' entry that none of megatron-core's expert modules saves: SequentialMLP's
// local_experts.N.*, GroupedMLP's weight1/weight2 (megatron_grouped_experts.h expands them
// before the model is read), TEGroupedMLP's linear_fc1.weight<N> (renamed by map_name).
void refuse_unknown_experts(const TorchFile& f, const std::string& key, const MappedName& m) {
  if (m.local_layer < 0 || !m.rest.starts_with("mlp.experts.") || is_expert(m.rest) || is_grouped_mlp_weight(m.rest))
    return;
  throw runtime_error(f.path() + ": model entry " + key +
                          " is no expert weight megatron-core saves (SequentialMLP's mlp.experts.local_experts.N.*, "
                          "GroupedMLP's mlp.experts.weight1/weight2, TEGroupedMLP's mlp.experts.linear_fc1.weight<N>)",
                      "the file is not a Megatron-LM checkpoint of GPT, or it is damaged");
}

// The legacy model nests its state dict by module ({"language_model": {"embedding": {...}}});
// the keys are the dotted paths.
void add_saved_params(const TorchFile& f, const Value& dict, const std::string& prefix, int depth,
                      std::vector<SavedParam>& out) {
  if (depth > 8) throw runtime_error(f.path() + ": the model state dict is nested more than 8 deep");
  for (const auto& [k, v] : dict.entries) {
    if (k->kind != Kind::Str) throw runtime_error(f.path() + ": the model state dict has a non-string key");
    const std::string key = prefix + k->text;
    std::optional<MappedName> m = map_name(key);
    if (!m) continue;
    refuse_unknown_experts(f, key, *m);
    if (v->kind == Kind::Dict) {
      add_saved_params(f, *v, key + ".", depth + 1, out);
      continue;
    }
    if (v->kind != Kind::Tensor)
      throw runtime_error(f.path() + ": model entry " + key + " is " + pickle::describe(*v) + ", not a tensor");
    const bool wd = megatron_decays_weight(key, v->tensor.shape.size());
    out.push_back({key, *m, v, wd, 0});
  }
}

// The model's state dict, `model`, or one per virtual pipeline chunk (`model0`, `model1`, ...,
// each chunk's layers numbered from 0).
std::vector<SavedParam> saved_params(const TorchFile& f) {
  std::vector<SavedParam> out;
  if (!f.root().get("model0")) {
    add_saved_params(f, *need(&f.root(), "model", f, Kind::Dict), "", 0, out);
    return out;
  }
  for (int chunk = 0; f.root().get("model" + std::to_string(chunk)); ++chunk) {
    const size_t first = out.size();
    add_saved_params(f, *need(&f.root(), "model" + std::to_string(chunk), f, Kind::Dict), "", 0, out);
    for (size_t i = first; i < out.size(); ++i) out[i].chunk = chunk;
  }
  return out;
}

// The number of layers in each chunk of a file.
std::vector<int> chunk_layer_counts(const std::vector<SavedParam>& params) {
  std::vector<std::set<int>> layers;
  for (const SavedParam& p : params) {
    if (static_cast<size_t>(p.chunk) >= layers.size()) layers.resize(p.chunk + 1);
    if (p.mapped.local_layer >= 0) layers[p.chunk].insert(p.mapped.local_layer);
  }
  std::vector<int> counts;
  for (const auto& l : layers) counts.push_back(static_cast<int>(l.size()));
  if (counts.empty()) counts.push_back(0);
  return counts;
}

json args_json(const TorchFile& f) {
  const Value* args = f.root().get("args");
  if (!args || args->kind != Kind::Object)
    throw runtime_error(f.path() + " has no 'args' Namespace", "the file is not a Megatron-LM training checkpoint");
  json j = json::object();
  for (const auto& [k, v] : args->entries)
    if (k->kind == Kind::Str) j[k->text] = to_json(*v);
  return j;
}

// The saved layout, from the first file's args, checked against the folders.
SavedLayout saved_layout(const std::string& it_dir, const json& args) {
  SavedLayout l{arg_int(args, "tensor_model_parallel_size", 1), arg_int(args, "pipeline_model_parallel_size", 1),
                arg_int(args, "expert_model_parallel_size", 1), 0};
  if (l.tp < 1 || l.pp < 1 || l.ep < 1 || l.tp > 4096 || l.pp > 4096 || l.ep > 4096)
    throw runtime_error(it_dir + ": the checkpoint's args record tensor/pipeline/expert-parallel sizes " +
                        std::to_string(l.tp) + "/" + std::to_string(l.pp) + "/" + std::to_string(l.ep));
  const int experts = arg_int(args, "num_experts", 0);
  if (l.ep > 1 && (experts < l.ep || experts % l.ep != 0))
    throw runtime_error(it_dir + ": the checkpoint's args record expert_model_parallel_size " + std::to_string(l.ep) +
                        " with num_experts " + std::to_string(experts) + ", which it does not divide");
  l.local_experts = experts / l.ep;
  for (int p = 0; p < l.pp; ++p)
    for (int e = 0; e < l.ep; ++e)
      for (int t = 0; t < l.tp; ++t)
        if (!fs::exists(fs::path(it_dir) / shard_rel(t, p, e, l)))
          throw runtime_error("checkpoint " + it_dir + " lacks " + shard_rel(t, p, e, l) + " (tensor-parallel rank " +
                                  std::to_string(t) + ", pipeline rank " + std::to_string(p) +
                                  ", expert-parallel rank " + std::to_string(e) + " of its TP=" +
                                  std::to_string(l.tp) + " PP=" + std::to_string(l.pp) + " EP=" +
                                  std::to_string(l.ep) + ")",
                              "copy the whole " + fs::path(it_dir).filename().string() + " folder");
  return l;
}

// Rank 0's file, under any of get_checkpoint_name's spellings (find_checkpoint_rank_0).
TorchFile open_first(const std::string& it_dir) {
  for (const char* folder : {"mp_rank_00", "mp_rank_00_000", "mp_rank_00_000_000"}) {
    const fs::path path = fs::path(it_dir) / folder / kMegatronFile;
    if (fs::exists(path)) return TorchFile::open(path.string());
  }
  throw runtime_error("checkpoint " + it_dir + " has no mp_rank_00[_000[_000]]/model_optim_rng.pt");
}

CheckpointState state_of(const TorchFile& f, const std::string& it_dir, const json& args) {
  CheckpointState s = megatron_training_state(f);
  const SavedLayout l = saved_layout(it_dir, args);
  s.layout.tensor_parallel = l.tp;
  s.layout.pipeline_parallel = l.pp;
  return s;
}

}  // namespace

CheckpointState megatron_training_state(const TorchFile& f) {
  const json args = args_json(f);
  CheckpointState s;
  s.megatron_format = true;
  s.args = args;
  s.iteration = as_int(f.root().get("iteration"), f, "'iteration'");
  s.consumed_train_samples = args.value("consumed_train_samples", int64_t{0});
  s.consumed_valid_samples = args.value("consumed_valid_samples", int64_t{0});
  s.layout = {arg_int(args, "tensor_model_parallel_size", 1), arg_int(args, "pipeline_model_parallel_size", 1),
              arg_int(args, "data_parallel_size", 1), arg_int(args, "virtual_pipeline_model_parallel_size", 1),
              args.value("padded_vocab_size", int64_t{0})};
  if (const Value* sched = f.root().get("opt_param_scheduler"); sched && sched->kind == Kind::Dict) {
    s.scheduler = to_json(*sched);
    s.scheduler_num_steps = as_int(sched->get("num_steps"), f, "opt_param_scheduler.num_steps");
    s.scheduler.erase("num_steps");
  }
  read_megatron_optimizer_progress(f, s);
  return s;
}

namespace {

// "exp_avg.decoder.layers.0.mlp.linear_fc1.weight" -> the parameter's name.
std::string parameter_of(const std::string& name) {
  for (const char* kind : {"exp_avg.", "exp_avg_sq.", "momentum_buffer."})
    if (name.starts_with(kind)) return name.substr(std::strlen(kind));
  return name;
}

// Every saved piece of the checkpoint, placed in its global tensor, and where its data is.
struct PieceSet {
  std::vector<ExternalSource> sources;
  std::vector<ExternalPiece> pieces;
  std::vector<std::pair<const TorchFile*, const pickle::TensorRef*>> data;  // per piece

  bool swiglu = false;  // the saving run's --swiglu: linear_fc1 pieces are [gate_r; up_r]

  // A piece of rank file `file` (sources[file_index]) whose data is tensor t of `holder`
  // (the rank file's own, or its distrib_optim.pt).
  void add(const RankFile& file, size_t file_index, int tp_size, const std::string& name, const TorchFile& holder,
           const pickle::TensorRef& t) {
    Shape shape(t.shape.begin(), t.shape.end());
    int split = split_dim_of(parameter_of(name));
    if (swiglu && is_gated_fc1(parameter_of(name), shape.size() + 1)) {
      if (shape.empty() || shape[0] % 2 != 0)
        throw runtime_error("checkpoint file " + file.file.path() + ": " + name + " " + shape_str(shape) +
                            " is not a SwiGLU fc1 ([gate; up] rows)", "check the checkpoint's --swiglu");
      shape[0] /= 2;
      shape.insert(shape.begin(), 2);
      split = 1;
    }
    TensorPlacement place{shape, -1, 0};
    if (tp_size > 1 && split >= 0 && split < static_cast<int>(shape.size())) {
      place.split_dim = split;
      place.global_shape[split] = shape[split] * tp_size;
      place.offset = shape[split] * file.tp;
    }
    pieces.push_back({name, shape, place, file_index});
    data.emplace_back(&holder, &t);
  }
};

// Every rank's file. Expert-parallel rank r's experts are numbered globally (r * L + local);
// its other parameters are marked replicas for r > 0 (rank 0's are read).
std::vector<RankFile> open_all(const std::string& it_dir, const SavedLayout& layout) {
  const int pp_size = layout.pp;
  std::vector<RankFile> files;
  std::vector<std::vector<int>> stage_chunk_layers(pp_size);  // from each stage's TP rank 0
  for (int pp = 0; pp < pp_size; ++pp)
    for (int ep = 0; ep < layout.ep; ++ep)
      for (int tp = 0; tp < layout.tp; ++tp) {
        const std::string rel = shard_rel(tp, pp, ep, layout);
        RankFile f{tp, pp, ep, rel, TorchFile::open((fs::path(it_dir) / rel).string()), {}, {}};
        f.grouped = expand_grouped_mlp_weights(f.file, layout.local_experts);
        f.params = saved_params(f.file);
        if (tp == 0 && ep == 0) stage_chunk_layers[pp] = chunk_layer_counts(f.params);
        for (SavedParam& p : f.params) {
          p.replica = ep > 0 && (p.mapped.local_layer < 0 || !is_expert(p.mapped.rest));
          p.mapped.rest = shift_expert(p.mapped.rest, ep * layout.local_experts);
        }
        files.push_back(std::move(f));
      }
  // The layers run through the virtual stages in order; chunk v of stage p is virtual stage
  // v * PP + p (megatron/core/transformer/transformer_block.py get_transformer_layer_offset).
  const size_t chunks = stage_chunk_layers[0].size();
  std::vector<std::vector<int>> first_layer(pp_size, std::vector<int>(chunks, 0));
  int next = 0;
  for (size_t v = 0; v < chunks; ++v)
    for (int pp = 0; pp < pp_size; ++pp) {
      if (stage_chunk_layers[pp].size() != chunks)
        throw runtime_error("checkpoint " + it_dir + ": " + shard_rel(0, pp, 0, layout) + " holds " +
                                std::to_string(stage_chunk_layers[pp].size()) + " model chunks, " +
                                shard_rel(0, 0, 0, layout) + " " + std::to_string(chunks),
                            "copy the whole folder from one save");
      first_layer[pp][v] = next;
      next += stage_chunk_layers[pp][v];
    }
  for (RankFile& f : files) f.first_layer = first_layer[f.pp];
  return files;
}

bool arg_is_true(const json& args, const char* name) {
  auto it = args.find(name);
  return it != args.end() && it->is_boolean() && it->get<bool>();
}

bool tied_output(const json& args) { return !arg_is_true(args, "untie_embeddings_and_output_weights"); }

// A file's parameters as its optimizer holds them: the local experts' in the expert optimizer
// when the checkpoint was saved at expert parallelism above 1 (allreduce=False); the replicas
// and the tied output layer's copy counted in the groups but not read.
std::vector<MegatronOptimizerParam> optimizer_params(const RankFile& f, const SavedLayout& layout, bool tied) {
  std::vector<MegatronOptimizerParam> out;
  for (const SavedParam& p : f.params) {
    const std::string name = global_name(p.mapped, f.first_layer.at(p.chunk));
    const bool expert = p.mapped.local_layer >= 0 && is_expert(p.mapped.rest);
    out.push_back({name, &p.tensor->tensor, p.weight_decay, layout.ep > 1 && expert,
                   !p.replica && !(tied && name == "output_layer.weight"), p.chunk});
  }
  return out;
}

}  // namespace

std::string megatron_shard_folder(int tp_rank, int pp_rank, int pp_size, int ep_rank, int ep_size) {
  std::string folder = checkpoint_shard_folder(tp_rank, pp_rank, pp_size);
  if (ep_size > 1) {
    char suffix[16];
    std::snprintf(suffix, sizeof(suffix), "_%03d", ep_rank);
    folder += suffix;
  }
  return folder;
}

bool is_megatron_checkpoint(const std::string& dir, int64_t iteration) {
  const fs::path it_dir = checkpoint_iteration_dir(dir, iteration);
  if (fs::exists(it_dir / "metadata.json")) return false;
  for (const char* folder : {"mp_rank_00", "mp_rank_00_000", "mp_rank_00_000_000"})
    if (fs::exists(it_dir / folder / kMegatronFile)) return true;
  return false;
}

CheckpointState read_megatron_metadata(const std::string& dir, int64_t iteration) {
  const std::string it_dir = checkpoint_iteration_dir(dir, iteration);
  const TorchFile f = open_first(it_dir);
  CheckpointState s = state_of(f, it_dir, args_json(f));
  if (iteration == kReleaseIteration) {
    s.release = true;
    s.iteration = 0;
  }
  return s;
}

void check_megatron_iteration(const std::string& it_dir, const CheckpointState& s, int64_t iteration) {
  if (!s.release && s.iteration != iteration)
    throw runtime_error(it_dir + " records iteration " + std::to_string(s.iteration),
                        "the folder was renamed or copied; restore its name");
}

CheckpointState load_megatron_checkpoint(const std::string& dir, int64_t iteration,
                                         const std::vector<FlatPiece>& model,
                                         const std::vector<FlatPiece>& optimizer, bool load_optimizer,
                                         int tp_rank, int tp_size) {
  const std::string it_dir = checkpoint_iteration_dir(dir, iteration);
  CheckpointState s = read_megatron_metadata(dir, iteration);
  load_optimizer = load_optimizer && !s.release;
  check_megatron_iteration(it_dir, s, iteration);
  const SavedLayout layout = saved_layout(it_dir, s.args);
  const int saved_tp = layout.tp;
  std::vector<RankFile> files = open_all(it_dir, layout);
  std::vector<std::string> folders;
  for (const RankFile& f : files) folders.push_back(fs::path(f.rel).parent_path().string());
  const bool distributed = load_optimizer && uses_distrib_optim(it_dir, folders);
  if (distributed && std::any_of(files.begin(), files.end(), [](const RankFile& f) { return f.grouped; }))
    throw runtime_error("checkpoint " + it_dir + " holds GroupedMLP experts (--moe-grouped-gemm) and " +
                            kDistribOptimFile + ": tessera does not read the distributed optimizer's state of "
                            "grouped experts",
                        "load its model with --no-load-optim (the optimizer starts fresh) or --finetune");
  const bool tied = tied_output(s.args);

  PieceSet model_set, optimizer_set;
  model_set.swiglu = optimizer_set.swiglu = arg_is_true(s.args, "swiglu");
  std::vector<DistribOptimFile> distrib;  // one per rank file; reserved: pieces point into them
  distrib.reserve(files.size());
  std::deque<pickle::TensorRef> views;    // the parameters' ranges of distrib_optim.pt's tensors
  for (size_t i = 0; i < files.size(); ++i) {
    const RankFile& f = files[i];
    model_set.sources.push_back({f.file.path(), f.tp});
    optimizer_set.sources.push_back({f.file.path(), f.tp});
    const std::vector<MegatronOptimizerParam> params = optimizer_params(f, layout, tied);
    const OptimizerStateSink add_state = [&](const std::string& key, const TorchFile& holder,
                                             const pickle::TensorRef& t) {
      optimizer_set.add(f, i, saved_tp, key, holder, t);
    };
    // The fp32 main values of its parameters (mixed precision's fp32_from_fp16_params, or
    // distrib_optim.pt's `param`), by name.
    MainParams main;
    if (distributed) {
      distrib.push_back(open_distrib_optim((fs::path(it_dir) / fs::path(f.rel).parent_path() /
                                            kDistribOptimFile).string()));
      read_distrib_optim(distrib.back(), f.file, params, s.args, f.pp == 0, tied, views, add_state, main);
    } else if (load_optimizer) {
      read_megatron_optimizer(f.file, params, add_state, main);
    }
    for (const MegatronOptimizerParam& p : params) {
      if (!p.wanted) continue;
      auto m = main.find(p.name);
      if (m != main.end())
        model_set.add(f, i, saved_tp, p.name, distributed ? distrib[i].file : f.file, *m->second);
      else
        model_set.add(f, i, saved_tp, p.name, f.file, *p.model);
    }
  }
  auto reader = [&](const PieceSet& set) {
    return [&set](size_t piece) {
      const auto& [holder, tensor] = set.data[piece];
      return holder->f32(*tensor, set.pieces[piece].name);
    };
  };
  const int preferred = static_cast<int>(static_cast<int64_t>(tp_rank) * saved_tp / tp_size);
  load_external_pieces(it_dir, model_set.sources, model_set.pieces, model, preferred, "parameter", reader(model_set));
  if (load_optimizer)
    load_external_pieces(it_dir, optimizer_set.sources, optimizer_set.pieces, optimizer, preferred, "optimizer state",
                         reader(optimizer_set));
  return s;
}

std::vector<MegatronFileSummary> summarize_megatron_checkpoint(const std::string& dir, int64_t iteration) {
  const std::string it_dir = checkpoint_iteration_dir(dir, iteration);
  const CheckpointState s = read_megatron_metadata(dir, iteration);
  const SavedLayout layout = saved_layout(it_dir, s.args);
  std::vector<MegatronFileSummary> out;
  for (int pp = 0; pp < layout.pp; ++pp)
    for (int rank = 0; rank < layout.ep * layout.tp; ++rank) {
      MegatronFileSummary sum;
      sum.rel = shard_rel(rank % layout.tp, pp, rank / layout.tp, layout);
      const TorchFile f = TorchFile::open((fs::path(it_dir) / sum.rel).string());
      for (const auto& [k, v] : f.root().entries)
        if (k->kind == Kind::Str) sum.top_level_keys.push_back(k->text);
      if (const Value* version = f.root().get("checkpoint_version"))
        sum.checkpoint_version = as_number(version, f, "checkpoint_version");
      sum.iteration = as_int(f.root().get("iteration"), f, "'iteration'");
      bool legacy = false, te = false;
      for (const SavedParam& p : saved_params(f)) {
        legacy = legacy || p.key.starts_with("language_model.") || p.key.starts_with("word_embeddings_for_head.");
        te = te || p.key.ends_with("layer_norm_weight");
        f.check(p.tensor->tensor, p.key);  // its storage's extent and CRC-32
        sum.model.push_back({p.key, p.tensor->tensor.storage.type, p.tensor->tensor.shape});
      }
      sum.names = legacy ? "legacy (language_model.*)" : te ? "mcore (Transformer Engine norms)" : "mcore";
      sum.optimizer = describe_megatron_optimizer(
          f, fs::exists(fs::path(it_dir) / fs::path(sum.rel).parent_path() / kDistribOptimFile));
      sum.optimizer += s.grad_scaler.is_null() ? "" : ", grad scaler";
      out.push_back(std::move(sum));
    }
  return out;
}

// ---- Writing --------------------------------------------------------------------------------

std::string megatron_local_name(const std::string& name, int first_layer, int first_expert) {
  std::optional<MappedName> m = map_name(name);
  if (!m || m->local_layer < 0) return name;
  return "decoder.layers." + std::to_string(m->local_layer - first_layer) + "." + shift_expert(m->rest, -first_expert);
}

Shape megatron_saved_shape(const std::string& name, const Shape& shape) { return megatron_shape(name, shape); }

int megatron_expert_of(const std::string& name) {
  std::optional<MappedName> m = map_name(name);
  if (!m || m->local_layer < 0 || !is_expert(m->rest)) return -1;
  return std::atoi(m->rest.c_str() + kLocalExperts.size());
}

namespace {

// The state dict of one model chunk, as the spec of the Namespace builds it
// (megatron_layer_spec.h); the last stage's last chunk ends with the output layer's extra state.
Value* model_dict(pickle::Document& doc, FileTensors& tensors, const MegatronFileSpec& spec,
                  const std::vector<MegatronParam>& params, int chunk, bool last_chunk) {
  std::vector<const MegatronParam*> mine;
  std::vector<std::string> names;
  for (const MegatronParam& p : params)
    if (p.chunk == chunk) {
      mine.push_back(&p);
      names.push_back(p.name);
    }
  Value* model = doc.dict();
  const bool te = megatron_uses_transformer_engine(spec.args);
  for (const MegatronModelEntry& e : megatron_model_entries(te, names, spec.last_stage && last_chunk)) {
    if (e.param < 0) {
      doc.set(model, e.key, megatron_extra_state_value(doc, tensors, e.extra));
      continue;
    }
    const MegatronParam& p = *mine[static_cast<size_t>(e.param)];
    doc.set(model, p.name, tensors.add(p.value, spec.model_dtype, megatron_shape(p.name, p.value.shape)));
  }
  return model;
}

// Megatron's `rng_state`: a list with this rank's one dict of generator states.
Value* rng_state_list(pickle::Document& doc, FileTensors& tensors, const MegatronRngState& rng) {
  std::vector<Value*> python, numpy;
  for (uint32_t w : rng.python_words) python.push_back(doc.integer(w));
  for (uint32_t w : rng.numpy_words) numpy.push_back(doc.integer(w));
  Value* state = doc.dict();
  doc.set(state, "random_rng_state", doc.tuple({doc.integer(3), doc.tuple(std::move(python)), doc.none()}));
  doc.set(state, "np_rng_state",
          doc.tuple({doc.str("MT19937"), doc.list(std::move(numpy)), doc.integer(rng.numpy_position), doc.integer(0),
                     doc.real(0.0)}));
  doc.set(state, "torch_rng_state", tensors.add_bytes(rng.torch_cpu));
  doc.set(state, "cuda_rng_state", tensors.add_bytes(rng.cuda));
  Value* tracker = doc.dict();
  for (const auto& [name, bytes] : rng.tracker) doc.set(tracker, name, tensors.add_bytes(bytes));
  doc.set(state, "rng_tracker_states", tracker);
  return doc.list({state});
}

// Megatron core_r0.10.0's `rerun_state_machine` (megatron/core/rerun_state_machine.py
// RerunStateMachine.state_dict, saved by megatron/training/checkpointing.py): tessera runs as
// Megatron's default --rerun-mode disabled does, whose machine never leaves NOT_RUNNING_YET
// and requests nothing; the enums pickle as Megatron's classes.
Value* rerun_state_dict(pickle::Document& doc, int64_t iteration) {
  Value* d = doc.dict();
  doc.set(d, "mode", from_json(doc, {{"$enum", "megatron.core.rerun_state_machine.RerunMode"}, {"value", "disabled"}}));
  doc.set(d, "state", from_json(doc, {{"$enum", "megatron.core.rerun_state_machine.RerunState"}, {"value", 0}}));
  doc.set(d, "current_iteration", doc.integer(iteration));
  doc.set(d, "rerun_requested", doc.boolean(false));
  doc.set(d, "checkpoint_requested", doc.boolean(false));
  return d;
}

// The Namespace as Megatron's training loop leaves it at this save: the fields it updates
// every iteration (megatron/training/training.py train: curr_iteration is the last step's).
json namespace_at_iteration(const MegatronFileSpec& spec) {
  json ns = spec.args;
  if (ns.contains("curr_iteration")) ns["curr_iteration"] = std::max<int64_t>(spec.iteration - 1, 0);
  if (ns.contains("iteration")) ns["iteration"] = spec.iteration;
  if (ns.contains("num_floating_point_operations_so_far"))
    ns["num_floating_point_operations_so_far"] = spec.floating_point_operations;
  return ns;
}

// The top-level dict both of Megatron's formats open with: args (the Namespace),
// checkpoint_version 3.0, iteration.
Value* megatron_root(pickle::Document& doc, const MegatronFileSpec& spec) {
  Value* root = doc.dict();
  Value* args = doc.object("argparse.Namespace");
  const json ns = namespace_at_iteration(spec);
  for (const auto& [k, v] : ns.items()) doc.set(args, k, from_json(doc, v));
  doc.set(root, "args", args);
  doc.set(root, "checkpoint_version", doc.real(3.0));
  doc.set(root, "iteration", doc.integer(spec.iteration));
  return root;
}

// Writes (and fsyncs) doc as a torch.save file whose archive is named `archive`.
void write_megatron_pickle(const std::string& path, const char* archive, pickle::Document& doc, Value* root,
                           const FileTensors& tensors) {
  doc.root = root;
  SyncedFileWriter file(path);
  const auto append = [&file](std::span<const uint8_t> b) {
    file.append({reinterpret_cast<const char*>(b.data()), b.size()});
  };
  write_torch_file(append, archive, *root, tensors.storages());
  file.finish();
}

}  // namespace

void write_megatron_file(const std::string& path, const MegatronFileSpec& spec,
                         const std::vector<MegatronParam>& sequential) {
  const GroupedMegatronParams grouped = group_megatron_experts(spec.args, megatron_spec_params(spec.args, sequential));
  const std::vector<MegatronParam>& params = grouped.params;
  pickle::Document doc;
  FileTensors tensors(doc);
  Value* root = megatron_root(doc, spec);
  int chunks = 1;
  for (const MegatronParam& p : params) chunks = std::max(chunks, p.chunk + 1);
  if (chunks == 1) doc.set(root, "model", model_dict(doc, tensors, spec, params, 0, true));
  for (int c = 0; chunks > 1 && c < chunks; ++c)
    doc.set(root, "model" + std::to_string(c), model_dict(doc, tensors, spec, params, c, c == chunks - 1));
  if (spec.with_optimizer) {
    doc.set(root, "optimizer", megatron_optimizer_state(doc, tensors, spec, params));
    doc.set(root, "opt_param_scheduler", from_json(doc, spec.scheduler));
  }
  doc.set(root, "rerun_state_machine", rerun_state_dict(doc, spec.iteration));
  if (spec.with_rng) {
    const int64_t seed = spec.args.value("seed", int64_t{1234});
    doc.set(root, "rng_state", rng_state_list(doc, tensors, megatron_rng_state(seed, spec.tp_rank, spec.pp_rank)));
  }
  doc.set(root, "num_floating_point_operations_so_far", doc.real(spec.floating_point_operations));
  write_megatron_pickle(path, "model_optim_rng", doc, root, tensors);
}

void append_megatron_rng_state_object(const zip::StoredWriter::Append& append, int64_t seed, int tp_rank,
                                      int pp_rank) {
  pickle::Document doc;
  FileTensors tensors(doc);
  // megatron/core/dist_checkpointing/strategies/torch.py saves a list of the ShardedObjects' data.
  doc.root = doc.list({rng_state_list(doc, tensors, megatron_rng_state(seed, tp_rank, pp_rank))});
  write_torch_file(append, "archive", *doc.root, tensors.storages());
}

void append_megatron_rerun_state_object(const zip::StoredWriter::Append& append, int64_t iteration) {
  pickle::Document doc;
  FileTensors tensors(doc);
  doc.root = doc.list({rerun_state_dict(doc, iteration)});
  write_torch_file(append, "archive", *doc.root, tensors.storages());
}

void write_torch_dist_common(const std::string& path, const MegatronFileSpec& spec,
                             const std::vector<bool>& group_weight_decay) {
  pickle::Document doc;
  FileTensors tensors(doc);
  Value* root = megatron_root(doc, spec);
  if (spec.with_optimizer) {
    doc.set(root, "optimizer", torch_dist_optimizer_state(doc, tensors, spec, group_weight_decay));
    doc.set(root, "opt_param_scheduler", from_json(doc, spec.scheduler));
  }
  doc.set(root, "num_floating_point_operations_so_far", doc.real(spec.floating_point_operations));
  write_megatron_pickle(path, "common", doc, root, tensors);
}

}  // namespace tessera
