#include "tessera/ckpt/megatron_optimizer_state.h"

#include <algorithm>
#include <filesystem>

#include "tessera/ckpt/megatron_layer_spec.h"
#include "tessera/core/error.h"

namespace tessera {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using megatron::arg_int;
using megatron::as_int;
using megatron::as_number;
using megatron::FileTensors;
using megatron::need;
using pickle::Kind;
using pickle::Value;

// Megatron's parameter groups of one optimizer: one per weight-decay class, in order of first
// appearance (its parameters' indices into `weight_decay`, and each group's class).
struct ParamGroups {
  std::vector<std::vector<size_t>> members;
  std::vector<bool> weight_decay;
};

ParamGroups param_groups(const std::vector<bool>& weight_decay) {
  ParamGroups g;
  for (size_t i = 0; i < weight_decay.size(); ++i) {
    auto it = std::find(g.weight_decay.begin(), g.weight_decay.end(), weight_decay[i]);
    if (it == g.weight_decay.end()) {
      g.weight_decay.push_back(weight_decay[i]);
      g.members.emplace_back();
      it = g.weight_decay.end() - 1;
    }
    g.members[static_cast<size_t>(it - g.weight_decay.begin())].push_back(i);
  }
  return g;
}

// ---- Writing --------------------------------------------------------------------------------

// A hyperparameter as the Namespace holds it (the flag's value, a Python float), else tessera's.
double hyperparameter(const MegatronFileSpec& spec, const char* arg, double fallback) {
  const auto it = spec.args.find(arg);
  return it != spec.args.end() && it->is_number() ? it->get<double>() : fallback;
}

Value* param_group(pickle::Document& doc, const MegatronFileSpec& spec, bool weight_decay, bool expert_parallel,
                   std::vector<Value*> indices) {
  Value* g = doc.dict();
  const OptimizerConfig& o = spec.optimizer;
  doc.set(g, "lr", doc.real(spec.lr));
  if (o.kind == OptimizerKind::Adam) {
    doc.set(g, "betas", doc.tuple({doc.real(hyperparameter(spec, "adam_beta1", o.adam_beta1)),
                                   doc.real(hyperparameter(spec, "adam_beta2", o.adam_beta2))}));
    doc.set(g, "eps", doc.real(hyperparameter(spec, "adam_eps", o.adam_eps)));
    doc.set(g, "weight_decay", doc.real(weight_decay ? spec.weight_decay : 0.0));
    doc.set(g, "amsgrad", doc.boolean(false));
    doc.set(g, "foreach", doc.none());
    doc.set(g, "maximize", doc.boolean(false));
    doc.set(g, "capturable", doc.boolean(false));
    doc.set(g, "differentiable", doc.boolean(false));
    doc.set(g, "fused", doc.none());
  } else {
    doc.set(g, "momentum", doc.real(hyperparameter(spec, "sgd_momentum", o.sgd_momentum)));
    doc.set(g, "dampening", doc.integer(0));
    doc.set(g, "weight_decay", doc.real(weight_decay ? spec.weight_decay : 0.0));
    doc.set(g, "nesterov", doc.boolean(false));
    doc.set(g, "maximize", doc.boolean(false));
    doc.set(g, "foreach", doc.none());
    doc.set(g, "differentiable", doc.boolean(false));
  }
  doc.set(g, "wd_mult", doc.real(weight_decay ? 1.0 : 0.0));
  doc.set(g, "lr_mult", doc.real(1.0));
  doc.set(g, "is_expert_parallel", doc.boolean(expert_parallel));
  doc.set(g, "is_decoupled_lr", doc.boolean(false));
  // _update_min_and_max_lr_in_param_groups: the run's --lr and --min-lr (tessera has no
  // --decoupled-lr).
  for (const auto& [key, arg] : {std::pair{"max_lr", "lr"}, std::pair{"min_lr", "min_lr"}})
    if (spec.args.contains(arg)) doc.set(g, key, doc.real(hyperparameter(spec, arg, 0.0)));
  doc.set(g, "params", doc.list(std::move(indices)));
  return g;
}

// A parameter group as a state_dict without its `params` (what torch_dist and the distributed
// optimizer keep).
Value* param_group_without_params(pickle::Document& doc, const MegatronFileSpec& spec, bool weight_decay,
                                  bool expert_parallel) {
  Value* g = param_group(doc, spec, weight_decay, expert_parallel, {});
  std::erase_if(g->entries, [](const auto& e) { return e.first->is_str("params"); });
  return g;
}

// The fp16 loss scaler's state_dict (megatron/core/optimizer/grad_scaler.py).
Value* grad_scaler_dict(pickle::Document& doc, FileTensors& tensors, const MegatronFileSpec& spec) {
  Value* scaler = doc.dict();
  doc.set(scaler, "scale", tensors.scalar(spec.grad_scaler.at("scale").get<float>()));
  doc.set(scaler, "growth_tracker", doc.integer(spec.grad_scaler.at("growth_tracker").get<int64_t>()));
  doc.set(scaler, "hysteresis_tracker", doc.integer(spec.grad_scaler.at("hysteresis_tracker").get<int64_t>()));
  return scaler;
}

// Megatron's mixed-precision optimizers (and the distributed one) wrap torch's state_dict as
// {"optimizer": inner, "grad_scaler": ... when the run scales its loss}; an fp32 run without a
// scaler saves torch's own.
bool wraps_torch_state(const MegatronFileSpec& spec) {
  return spec.model_dtype != DType::F32 || !spec.grad_scaler.is_null();
}

Value* wrapped_state(pickle::Document& doc, FileTensors& tensors, const MegatronFileSpec& spec, Value* inner) {
  Value* outer = doc.dict();
  doc.set(outer, "optimizer", inner);
  if (!spec.grad_scaler.is_null()) doc.set(outer, "grad_scaler", grad_scaler_dict(doc, tensors, spec));
  return outer;
}

// The distributed optimizer's state_dict (megatron/core/optimizer/distrib_optimizer.py):
// torch's without `state`, each group without `params` and with the step (torch's AdamW
// keeps it per parameter), and the grad scaler.
Value* distributed_optimizer_dict(pickle::Document& doc, FileTensors& tensors, const MegatronFileSpec& spec,
                                  const std::vector<bool>& group_wd, bool expert_parallel) {
  Value* groups = doc.list();
  for (bool wd : group_wd) {
    Value* g = param_group_without_params(doc, spec, wd, expert_parallel);
    doc.set(g, "step", doc.real(static_cast<double>(spec.optimizer_steps)));
    groups->items.push_back(g);
  }
  Value* inner = doc.dict();
  doc.set(inner, "param_groups", groups);
  return wrapped_state(doc, tensors, spec, inner);
}

// One optimizer's state_dict over `params` (all of one kind, dense or expert): torch's over
// Megatron's groups, wrapped as Megatron's mixed-precision optimizer wraps it when the model is
// 16-bit.
Value* optimizer_dict(pickle::Document& doc, FileTensors& tensors, const MegatronFileSpec& spec,
                      const std::vector<const MegatronParam*>& params, bool expert_parallel) {
  std::vector<bool> weight_decay;
  for (const MegatronParam* p : params) weight_decay.push_back(p->weight_decay);
  const ParamGroups groups = param_groups(weight_decay);
  if (spec.distributed_optimizer)
    return distributed_optimizer_dict(doc, tensors, spec, groups.weight_decay, expert_parallel);
  Value* state = doc.dict();
  Value* group_list = doc.list();
  Value* masters = doc.list();
  int64_t index = 0;
  for (size_t g = 0; g < groups.members.size(); ++g) {
    std::vector<Value*> indices, group_masters;
    for (size_t i : groups.members[g]) {
      const MegatronParam& p = *params[i];
      const Shape shape = megatron_saved_shape(p.name, p.value.shape);
      if (!p.state.empty()) {
        Value* st = doc.dict();
        if (spec.optimizer.kind == OptimizerKind::Adam)
          doc.set(st, "step", tensors.scalar(static_cast<float>(spec.optimizer_steps)));
        for (const auto& [kind, t] : p.state) doc.set(st, kind, tensors.add(t, DType::F32, shape));
        doc.set(state, doc.integer(index), st);
      }
      if (spec.model_dtype != DType::F32) group_masters.push_back(tensors.add(p.value, DType::F32, shape));
      indices.push_back(doc.integer(index++));
    }
    group_list->items.push_back(param_group(doc, spec, groups.weight_decay[g], expert_parallel, std::move(indices)));
    masters->items.push_back(doc.list(std::move(group_masters)));
  }
  Value* inner = doc.dict();
  doc.set(inner, "state", state);
  doc.set(inner, "param_groups", group_list);
  if (!wraps_torch_state(spec)) return inner;
  Value* outer = wrapped_state(doc, tensors, spec, inner);
  if (spec.model_dtype != DType::F32) doc.set(outer, "fp32_from_fp16_params", masters);
  return outer;
}

// What MegatronOptimizer.sharded_state_dict leaves unsharded (megatron/core/optimizer/
// optimizer.py): torch's groups without `params` (the loader's own), the step every parameter
// shares as state.common_step; a 16-bit run's wrapper adds the grad scaler.
Value* torch_dist_replicated_optimizer_dict(pickle::Document& doc, FileTensors& tensors, const MegatronFileSpec& spec,
                                            const std::vector<bool>& group_wd) {
  Value* groups = doc.list();
  for (bool wd : group_wd) groups->items.push_back(param_group_without_params(doc, spec, wd, false));
  Value* inner = doc.dict();
  Value* state = doc.dict();
  if (spec.optimizer.kind == OptimizerKind::Adam)
    doc.set(state, "common_step", tensors.scalar(static_cast<float>(spec.optimizer_steps)));
  doc.set(inner, "state", state);
  doc.set(inner, "param_groups", groups);
  return wraps_torch_state(spec) ? wrapped_state(doc, tensors, spec, inner) : inner;
}

}  // namespace

Value* megatron_optimizer_state(pickle::Document& doc, FileTensors& tensors, const MegatronFileSpec& spec,
                                const std::vector<MegatronParam>& params) {
  std::vector<const MegatronParam*> dense, expert;
  for (const MegatronParam& p : params) (p.expert_parallel ? expert : dense).push_back(&p);
  if (expert.empty()) return optimizer_dict(doc, tensors, spec, dense, false);
  // get_megatron_optimizer's ChainedOptimizer: its state_dict is the list of its optimizers'.
  return doc.list({optimizer_dict(doc, tensors, spec, dense, false), optimizer_dict(doc, tensors, spec, expert, true)});
}

Value* torch_dist_optimizer_state(pickle::Document& doc, FileTensors& tensors, const MegatronFileSpec& spec,
                                  const std::vector<bool>& group_weight_decay) {
  if (!spec.distributed_optimizer) return torch_dist_replicated_optimizer_dict(doc, tensors, spec, group_weight_decay);
  // DistributedOptimizer.sharded_state_dict's unsharded part with the fully_sharded_model_space
  // layout: its state_dict() (groups with their step, the grad scaler) and the sharding type.
  Value* optimizer = distributed_optimizer_dict(doc, tensors, spec, group_weight_decay, false);
  doc.set(optimizer, "param_state_sharding_type", doc.str("fully_sharded_model_space"));
  return optimizer;
}

// ---- Reading --------------------------------------------------------------------------------

namespace {

// The optimizer dict torch's optimizer wrote (inside Megatron's mixed-precision wrapper).
const Value* inner_optimizer(const Value* optimizer) {
  if (!optimizer || optimizer->kind != Kind::Dict) return nullptr;
  const Value* inner = optimizer->get("optimizer");
  return inner && inner->kind == Kind::Dict ? inner : optimizer;
}

// The state dict of each of the file's optimizers: one, or a ChainedOptimizer's list.
std::vector<const Value*> chained_optimizers(const Value* optimizer) {
  if (optimizer && optimizer->kind == Kind::List) return {optimizer->items.begin(), optimizer->items.end()};
  if (optimizer) return {optimizer};
  return {};
}

Error optimizer_mismatch(const TorchFile& file, const std::string& what) {
  return runtime_error(file.path() + ": the optimizer's parameter groups do not match the model's (" + what + ")",
                       "load with --no-load-optim (the model loads; the optimizer starts fresh)");
}

// One optimizer's state dict over `params` (all of its parameters, in order).
void read_one_optimizer(const TorchFile& file, const Value* optimizer, const std::string& label,
                        const std::vector<const MegatronOptimizerParam*>& params, const OptimizerStateSink& add,
                        MainParams& main) {
  const Value* inner = inner_optimizer(optimizer);
  if (!inner) throw optimizer_mismatch(file, label + " is " + pickle::describe(*optimizer) + ", not a state dict");
  const Value* groups = need(inner, "param_groups", file, Kind::List);
  const Value* state = need(inner, "state", file, Kind::Dict);
  std::vector<bool> weight_decay;
  for (const MegatronOptimizerParam* p : params) weight_decay.push_back(p->weight_decay);
  const ParamGroups mine = param_groups(weight_decay);
  const Value* fp32 = optimizer->get("fp32_from_fp16_params");
  if (groups->items.size() != mine.members.size())
    throw optimizer_mismatch(file, label + ": " + std::to_string(groups->items.size()) + " groups saved, " +
                                       std::to_string(mine.members.size()) + " expected");
  for (size_t g = 0; g < mine.members.size(); ++g) {
    const Value* indices = need(groups->items[g], "params", file, Kind::List);
    if (indices->items.size() != mine.members[g].size())
      throw optimizer_mismatch(file, label + ": group " + std::to_string(g) + " holds " +
                                         std::to_string(indices->items.size()) + " parameters, the model " +
                                         std::to_string(mine.members[g].size()));
    for (size_t k = 0; k < mine.members[g].size(); ++k) {
      const MegatronOptimizerParam& p = *params[mine.members[g][k]];
      if (!p.wanted) continue;
      if (fp32) {
        const Value* group = fp32->kind == Kind::List && g < fp32->items.size() ? fp32->items[g] : nullptr;
        if (!group || group->kind != Kind::List || k >= group->items.size() || group->items[k]->kind != Kind::Tensor)
          throw optimizer_mismatch(file, label + ": fp32_from_fp16_params lacks parameter " + p.name);
        main[p.name] = &group->items[k]->tensor;
      }
      const int64_t index = as_int(indices->items[k], file, "a parameter index");
      const Value* st = nullptr;
      for (const auto& [key, v] : state->entries)
        if (key->kind == Kind::Int && key->integer == index) st = v;
      if (!st) continue;  // no state yet (no step taken): the optimizer's zeros
      for (const auto& [key, v] : st->entries) {
        if (key->kind != Kind::Str || v->kind != Kind::Tensor || key->text == "step") continue;
        add(key->text + "." + p.name, file, v->tensor);
      }
    }
  }
}

}  // namespace

void read_megatron_optimizer(const TorchFile& file, const std::vector<MegatronOptimizerParam>& params,
                             const OptimizerStateSink& add, MainParams& main) {
  const std::vector<const Value*> optimizers = chained_optimizers(file.root().get("optimizer"));
  if (optimizers.empty())
    throw runtime_error("checkpoint file " + file.path() + " has no optimizer state (a converter's checkpoint, or "
                        "saved with --no-save-optim)",
                        "pass --no-load-optim or --finetune");
  std::vector<const MegatronOptimizerParam*> dense, expert;
  for (const MegatronOptimizerParam& p : params) (p.expert_parallel ? expert : dense).push_back(&p);
  const size_t expected = expert.empty() ? 1 : 2;
  if (optimizers.size() != expected)
    throw optimizer_mismatch(
        file, std::to_string(optimizers.size()) + (optimizers.size() == 1 ? " optimizer" : " chained optimizers") +
                  " saved; its " + (expert.empty() ? "parameters need one" : "local experts need a dense and an "
                                                                              "expert optimizer, chained"));
  read_one_optimizer(file, optimizers[0], expert.empty() ? "the optimizer" : "the dense optimizer (optimizer[0])",
                     dense, add, main);
  if (!expert.empty()) read_one_optimizer(file, optimizers[1], "the expert optimizer (optimizer[1])", expert, add, main);
}

void read_megatron_optimizer_progress(const TorchFile& f, CheckpointState& s) {
  const std::vector<const Value*> optimizers = chained_optimizers(f.root().get("optimizer"));
  const Value* optimizer = optimizers.empty() ? nullptr : optimizers.front();
  const Value* inner = inner_optimizer(optimizer);
  if (!inner) return;
  // torch's AdamW keeps `step` per parameter, Apex/TE FusedAdam per group.
  if (const Value* state = inner->get("state"); state && state->kind == Kind::Dict && !state->entries.empty()) {
    const Value* first = state->entries.front().second;
    if (first->kind == Kind::Dict && first->get("step")) s.optimizer_steps = as_int(first->get("step"), f, "step");
    // torch_dist's common.pt: the step every parameter shares (megatron/core/optimizer/optimizer.py
    // _extract_common_per_param_step)
    if (const Value* common = state->get("common_step")) s.optimizer_steps = as_int(common, f, "state.common_step");
  } else if (const Value* groups = inner->get("param_groups"); groups && groups->kind == Kind::List &&
                                                                !groups->items.empty() && groups->items[0]->get("step")) {
    s.optimizer_steps = as_int(groups->items[0]->get("step"), f, "param_groups[0].step");
  }
  if (const Value* scaler = optimizer->get("grad_scaler"); scaler && scaler->kind == Kind::Dict)
    s.grad_scaler = {{"scale", as_number(scaler->get("scale"), f, "grad_scaler.scale")},
                     {"growth_tracker", as_int(scaler->get("growth_tracker"), f, "grad_scaler.growth_tracker")},
                     {"hysteresis_tracker",
                      as_int(scaler->get("hysteresis_tracker"), f, "grad_scaler.hysteresis_tracker")}};
}

std::string describe_megatron_optimizer(const TorchFile& file, bool distrib_optim_beside) {
  const std::vector<const Value*> optimizers = chained_optimizers(file.root().get("optimizer"));
  std::string out = distrib_optim_beside       ? "distributed optimizer (distrib_optim.pt)"
                    : optimizers.empty()       ? "none"
                    : optimizers[0]->get("fp32_from_fp16_params") ? "mixed precision (fp32_from_fp16_params)"
                                                                  : "fp32";
  if (optimizers.size() > 1) out += ", " + std::to_string(optimizers.size()) + " chained (dense, expert)";
  return out;
}

bool uses_distrib_optim(const std::string& it_dir, const std::vector<std::string>& folders) {
  size_t found = 0;
  for (const std::string& folder : folders) found += fs::exists(fs::path(it_dir) / folder / kDistribOptimFile);
  if (found != 0 && found != folders.size())
    throw runtime_error("checkpoint " + it_dir + " has " + kDistribOptimFile + " beside " + std::to_string(found) +
                            " of its " + std::to_string(folders.size()) + " " + kMegatronFile + " files",
                        "copy the whole folder from one save, or pass --no-load-optim");
  return found != 0;
}

namespace {

// One optimizer's parameters as Megatron's gradient buffers see them.
struct BufferParams {
  std::vector<int64_t> numels;
  std::vector<std::string> names;  // top-level names (the embedding, final norm, output layer) as saved
  std::vector<int> chunks;
};

// The data-parallel sizes of the dense and the expert optimizer's buffers (parallel_state.py:
// the expert-data-parallel group is world / (expert TP x EP x PP) ranks).
int dense_data_parallel(const json& args) {
  return arg_int(args, "data_parallel_size", 1) * arg_int(args, "context_parallel_size", 1);
}
int expert_data_parallel(const json& args) {
  const int tp = arg_int(args, "tensor_model_parallel_size", 1), pp = arg_int(args, "pipeline_model_parallel_size", 1);
  const int etp = arg_int(args, "expert_tensor_parallel_size", tp), ep = arg_int(args, "expert_model_parallel_size", 1);
  const int world = arg_int(args, "world_size", dense_data_parallel(args) * tp * pp);
  return std::max(1, world / std::max(1, etp * ep * pp));
}

// The gradient-buffer layout a saving rank had for one optimizer's parameters, as Megatron
// builds it (megatron/core/distributed/distributed_data_parallel.py): its parameters in
// registration order per model chunk, over `data_parallel` ranks, one bucket unless
// --overlap-grad-reduce (then --ddp-bucket-size, default max(4e7, 1e6 x DP), on the first
// pipeline stage only), and the shared embedding's bucket of its own.
GradBufferLayout megatron_buffer_layout(const BufferParams& params, const json& args, bool first_stage, bool tied,
                                        int data_parallel) {
  GradBufferOptions o;
  o.data_parallel = data_parallel;
  o.distributed_optimizer = true;
  const auto overlap = args.find("overlap_grad_reduce");
  if (first_stage && overlap != args.end() && overlap->is_boolean() && overlap->get<bool>()) {
    const auto size = args.find("ddp_bucket_size");
    o.bucket_size = size != args.end() && size->is_number_integer()
                        ? size->get<int64_t>()
                        : std::max<int64_t>(40000000, 1000000LL * dense_data_parallel(args));
  }
  // Megatron's shared_embedding (megatron/core/models/common/language_module/language_module.py):
  // a tied word embedding on a stage with the embedding or the head (final norm), not both.
  const auto has = [&](const char* name) {
    return std::find(params.names.begin(), params.names.end(), name) != params.names.end();
  };
  const bool shared = tied && has("embedding.word_embeddings.weight") != has("decoder.final_layernorm.weight");
  std::vector<bool> own_bucket;
  for (const std::string& n : params.names)
    own_bucket.push_back(shared && (n == "embedding.word_embeddings.weight" || n == "output_layer.weight"));
  return build_grad_buffer_layout(params.numels, o, own_bucket, params.chunks);
}

std::string list_str(const std::vector<int64_t>& v) {
  std::string s;
  for (int64_t x : v) s += (s.empty() ? "" : ", ") + std::to_string(x);
  return "[" + s + "]";
}

// One optimizer's part of distrib_optim.pt over `params` (its parameters, in order).
void read_distrib_optim_part(const DistribOptimBuffers& d, const std::string& path, const TorchFile& holder,
                             const TorchFile& model_file, const std::vector<const MegatronOptimizerParam*>& params,
                             const json& args, bool first_stage, bool tied, int data_parallel,
                             std::deque<pickle::TensorRef>& views, const OptimizerStateSink& add, MainParams& main) {
  BufferParams bp;
  for (const MegatronOptimizerParam* p : params) {
    int64_t n = 1;
    for (int64_t dim : p->model->shape) n *= dim;
    bp.numels.push_back(n);
    bp.names.push_back(p->name);
    bp.chunks.push_back(p->chunk);
  }
  const DistribOptimPlacement place =
      distrib_optim_placement(megatron_buffer_layout(bp, args, first_stage, tied, data_parallel), bp.chunks);
  if (place.numel_unpadded != d.numel_unpadded)
    throw runtime_error(path + " holds buffers of " + list_str(d.numel_unpadded) + " elements; the parameters of " +
                            model_file.path() + " lay out to " + list_str(place.numel_unpadded) +
                            " (data-parallel size " + std::to_string(data_parallel) +
                            " and the bucket size of its args)",
                        "the two files are not of one save; pass --no-load-optim to load the model alone");
  for (size_t i = 0; i < params.size(); ++i) {
    const MegatronOptimizerParam& p = *params[i];
    if (!p.wanted) continue;
    for (const char* key : kDistribOptimKeys) {
      pickle::TensorRef view = *d.buffers[static_cast<size_t>(place.buffer[i])].at(key);
      view.storage_offset += place.offset[i];
      view.shape = p.model->shape;
      view.stride.assign(view.shape.size(), 1);
      for (size_t k = view.shape.size(); k-- > 1;) view.stride[k - 1] = view.stride[k] * view.shape[k];
      views.push_back(std::move(view));
      if (std::string(key) == "param")
        main[p.name] = &views.back();
      else
        add(std::string(key) + "." + p.name, holder, views.back());
    }
  }
}

}  // namespace

void read_distrib_optim(const DistribOptimFile& d, const TorchFile& model_file,
                        const std::vector<MegatronOptimizerParam>& params, const json& args, bool first_stage,
                        bool tied, std::deque<pickle::TensorRef>& views, const OptimizerStateSink& add,
                        MainParams& main) {
  std::vector<const MegatronOptimizerParam*> dense, expert;
  for (const MegatronOptimizerParam& p : params) (p.expert_parallel ? expert : dense).push_back(&p);
  const size_t expected = expert.empty() ? 1 : 2;
  const std::string& path = d.file.path();
  if (d.optimizers.size() != expected)
    throw runtime_error(path + " holds " + std::to_string(d.optimizers.size()) + " optimizers' state; the parameters of " +
                            model_file.path() + " need " +
                            (expert.empty() ? "one" : "a dense and an expert optimizer's, chained"),
                        "the two files are not of one save; pass --no-load-optim to load the model alone");
  const bool dense_wanted = std::any_of(dense.begin(), dense.end(), [](const auto* p) { return p->wanted; });
  if (d.optimizers[0])
    read_distrib_optim_part(*d.optimizers[0], path, d.file, model_file, dense, args, first_stage, tied,
                            dense_data_parallel(args), views, add, main);
  else if (dense_wanted)
    throw runtime_error(path + " holds None for the dense optimizer, whose state this file must give",
                        "copy distrib_optim.pt of expert-parallel rank 0 from the same save, or pass --no-load-optim");
  if (expected == 2 && !d.optimizers[1])
    throw runtime_error(path + " holds None for the expert optimizer", "pass --no-load-optim");
  if (expected == 2)
    read_distrib_optim_part(*d.optimizers[1], path, d.file, model_file, expert, args, first_stage, tied,
                            expert_data_parallel(args), views, add, main);
}

void write_megatron_distrib_optim(const std::string& path, const MegatronFileSpec& spec,
                                  const std::vector<MegatronParam>& local_params, bool with_dense) {
  // The buffers follow the spec's parameter order (megatron_layer_spec.h).
  const std::vector<MegatronParam> params = megatron_spec_params(spec.args, local_params);
  std::vector<const MegatronParam*> dense, expert;
  for (const MegatronParam& p : params) (p.expert_parallel ? expert : dense).push_back(&p);
  const bool tied = !spec.args.value("untie_embeddings_and_output_weights", false);
  std::deque<GradBufferLayout> layouts;
  std::deque<DistribOptimState> states;
  auto state = [&](const std::vector<const MegatronParam*>& part, int data_parallel) -> const DistribOptimState* {
    BufferParams bp;
    for (const MegatronParam* p : part) {
      bp.numels.push_back(p->value.numel());
      bp.names.push_back(p->name);
      bp.chunks.push_back(p->chunk);
    }
    layouts.push_back(megatron_buffer_layout(bp, spec.args, spec.pp_rank == 0, tied, data_parallel));
    DistribOptimState& s = states.emplace_back();
    s.param_dtype = spec.model_dtype;
    s.grad_dtype = spec.grad_dtype;
    s.layout = &layouts.back();
    s.chunks = bp.chunks;
    // kind 0 is `param` (the main values), then the moments in kDistribOptimKeys' order.
    s.fill = [part](size_t p, size_t kind, float* dst) {
      const MegatronParam& mp = *part[p];
      if (kind == 0) return read_tensor_bytes(mp.value, dst);
      for (const auto& [name, t] : mp.state)
        if (name == kDistribOptimKeys[kind]) return read_tensor_bytes(t, dst);
      TESSERA_CHECK(false, "distrib_optim: a parameter without its optimizer state");
    };
    return &s;
  };
  // ChainedOptimizer.save_parameter_state: None for the dense optimizer unless this rank is its
  // data-parallel rank 0.
  std::vector<const DistribOptimState*> optimizers;
  optimizers.push_back(with_dense || expert.empty() ? state(dense, dense_data_parallel(spec.args)) : nullptr);
  if (!expert.empty()) optimizers.push_back(state(expert, expert_data_parallel(spec.args)));
  write_distrib_optim_file(path, optimizers);
}

}  // namespace tessera
