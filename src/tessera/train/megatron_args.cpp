#include "tessera/train/megatron_args.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <map>

#include "tessera/core/error.h"
#include "tessera/core/python_format.h"
#include "tessera/train/megatron_flags.h"

namespace tessera {
namespace {

using json = nlohmann::json;

// One attribute of the Namespace Megatron-LM core_r0.10.0 saves (megatron_namespace.inc,
// generated from Megatron's parser by tests/reference/megatron_namespace.py).
struct MegatronDest {
  const char* name;
  const char* default_json;  // the parser's default; null for what Megatron derives
};

constexpr MegatronDest kMegatronDests[] = {
#define MEGATRON_DEST(name, default_json) {name, default_json},
#include "tessera/train/megatron_namespace.inc"
#undef MEGATRON_DEST
};

// A parsed value of tessera's option table as Megatron's parser would have typed it.
json typed(const OptionDef& d, const ParsedOptions& p) {
  if (d.kind == OptKind::List) {
    json a = json::array();
    for (const std::string& v : p.get_list(d.flag)) a.push_back(v);
    return a.empty() ? json(nullptr) : a;
  }
  const std::optional<std::string> raw = p.raw(d.flag);
  if (!raw || *raw == "None") return nullptr;
  switch (d.kind) {
    case OptKind::Int: return std::strtoll(raw->c_str(), nullptr, 10);
    case OptKind::Float: return std::strtod(raw->c_str(), nullptr);
    case OptKind::StoreTrue:
    case OptKind::StoreFalse: return *raw == "True";
    default: return *raw;
  }
}

const char* decay_style_name(LrDecayStyle s) {
  switch (s) {
    case LrDecayStyle::Constant: return "constant";
    case LrDecayStyle::Linear: return "linear";
    case LrDecayStyle::Cosine: return "cosine";
    case LrDecayStyle::InverseSquareRoot: return "inverse-square-root";
    case LrDecayStyle::WSD: return "WSD";
  }
  return "linear";
}

const char* wd_style_name(WdIncrStyle s) {
  switch (s) {
    case WdIncrStyle::Constant: return "constant";
    case WdIncrStyle::Linear: return "linear";
    case WdIncrStyle::Cosine: return "cosine";
  }
  return "constant";
}

bool same_number(const json& a, double b) {
  return a.is_number() && std::fabs(a.get<double>() - b) <= 1e-12 * std::max(1.0, std::fabs(b));
}

// What megatron/training/arguments.py validate_args derives from the parsed flags, in its
// order, for the settings a tessera run can hold.
void apply_validate_args(json& ns, const TrainArgs& a) {
  const int tp = a.tensor_parallel_size, pp = a.pipeline_parallel_size;
  ns["rank"] = 0;  // parse_args: RANK of the saving process; rank 0's Namespace is the one read
  ns["world_size"] = a.world_size;
  ns["use_dist_ckpt"] = ns["ckpt_format"] != "torch";
  ns["transformer_pipeline_model_parallel_size"] = ns["standalone_embedding_stage"] == true ? pp - 1 : pp;
  ns["data_parallel_size"] = a.data_parallel_size;
  ns["context_parallel_size"] = a.context_parallel_size;
  if (ns["expert_tensor_parallel_size"].is_null()) ns["expert_tensor_parallel_size"] = tp;
  if (a.model.recompute == Recompute::Selective) ns["recompute_granularity"] = "selective";  // --recompute-activations
  if (!ns["data_path"].is_null() && ns["split"].is_null()) ns["split"] = "969, 30, 1";
  ns["global_batch_size"] = a.global_batch_size;
  const int virtual_stages = a.pipeline_split.virtual_stages;
  if (virtual_stages > 1) {
    ns["num_layers_per_virtual_pipeline_stage"] = a.model.num_layers / (pp * virtual_stages);
    ns["virtual_pipeline_model_parallel_size"] = virtual_stages;
  } else {
    ns["virtual_pipeline_model_parallel_size"] = nullptr;
    ns["overlap_p2p_comm"] = false;
    ns["align_param_gather"] = false;
  }
  ns["params_dtype"] = {{"$global", a.bf16 ? "torch.bfloat16" : a.fp16 ? "torch.float16" : "torch.float32"}};
  if (a.fp16 && ns["loss_scale"].is_null()) ns["check_for_nan_in_loss_and_grad"] = false;
  if (a.bf16) ns["accumulate_allreduce_grads_in_fp32"] = true;
  if (ns["dataloader_type"].is_null()) ns["dataloader_type"] = "single";
  ns["variable_seq_lengths"] = false;
  const GPTConfig& m = a.model;
  ns["num_layers"] = m.num_layers;
  ns["encoder_num_layers"] = m.num_layers;
  ns["hidden_size"] = m.hidden_size;
  ns["num_attention_heads"] = m.num_attention_heads;
  ns["ffn_hidden_size"] = m.ffn_hidden_size;
  ns["kv_channels"] = m.kv_channels;
  ns["encoder_seq_length"] = ns["seq_length"];
  if (ns["weight_decay_incr_style"] == "constant") {
    ns["start_weight_decay"] = ns["weight_decay"];
    ns["end_weight_decay"] = ns["weight_decay"];
  }
  if (tp == 1) ns["sequence_parallel"] = false;
  if (ns["sequence_parallel"] == true) ns["async_tensor_model_parallel_allreduce"] = false;
  if (!m.add_bias_linear) ns["bias_gelu_fusion"] = false;
  if (m.add_bias_linear) ns["add_qkv_bias"] = true;
  ns["position_embedding_type"] = m.position_embedding == PositionEmbedding::Rope   ? "rope"
                                  : m.position_embedding == PositionEmbedding::None ? "none"
                                                                                    : "learned_absolute";
  if (ns["position_embedding_type"] != "rope") ns["apply_rope_fusion"] = false;
  // core_r0.10.0's --use-rope-scaling has factor 8; another is later Megatron's rope_scaling_factor.
  if (m.use_rope_scaling && m.rope_scaling_factor != 8.0f) ns["rope_scaling_factor"] = m.rope_scaling_factor;
  if (ns["num_experts"] == 0) ns["num_experts"] = nullptr;
  if (ns["moe_ffn_hidden_size"].is_null()) ns["moe_ffn_hidden_size"] = m.ffn_hidden_size;
  // moe_freq_type (megatron/training/arguments.py): the int N, or the list "[1,0,...]" evaluates to.
  if (ns["moe_layer_freq"].is_string()) {
    const std::string freq = ns["moe_layer_freq"];
    const json list = json::parse(freq, nullptr, false);
    ns["moe_layer_freq"] = list.is_array() ? list : json(std::strtoll(freq.c_str(), nullptr, 10));
  }
  if (ns["apply_query_key_layer_scaling"] == true) ns["attention_softmax_in_fp32"] = true;
  ns["consumed_train_samples"] = 0;
  ns["skipped_train_samples"] = 0;
  ns["consumed_valid_samples"] = 0;
}

// What training sets on `args` before a save (megatron/training/training.py, tokenizer.py);
// the iteration's fields are write_megatron_file's (megatron_checkpoint.h).
void apply_training(json& ns, const TrainArgs& a, int64_t consumed_train_samples, int64_t consumed_valid_samples) {
  ns["padded_vocab_size"] = a.model.padded_vocab_size;
  ns["model_type"] = {{"$enum", "megatron.core.enums.ModelType"}, {"value", 1}};  // encoder_or_decoder
  ns["train_iters"] = a.train_iters;
  if (ns["lr_decay_iters"].is_null() && ns["lr_decay_samples"].is_null()) ns["lr_decay_iters"] = a.train_iters;
  ns["num_query_groups"] = a.model.query_groups();  // num_floating_point_operations: heads without GQA
  ns["consumed_train_samples"] = consumed_train_samples;
  ns["consumed_valid_samples"] = consumed_valid_samples;
  // build_train_valid_test_data_loaders: 1 or 0, as the broadcast tensor's items.
  ns["do_train"] = a.train_iters > 0 ? 1 : 0;
  ns["do_valid"] = ns["do_test"] = ns["eval_iters"].is_number() && ns["eval_iters"].get<int64_t>() > 0 ? 1 : 0;
  ns["iteration"] = 0;
  ns["curr_iteration"] = 0;
  ns["num_floating_point_operations_so_far"] = 0;
}

}  // namespace

json megatron_namespace(const TrainArgs& a, int64_t consumed_train_samples, int64_t consumed_valid_samples) {
  json ns = json::object();
  for (const MegatronDest& d : kMegatronDests) ns[d.name] = json::parse(d.default_json);
  std::vector<char*> argv;
  std::vector<std::string> line = a.command_line;
  for (std::string& s : line) argv.push_back(s.data());
  const ParsedOptions p = train_option_table().parse(static_cast<int>(argv.size()), argv.data());
  // The flags given; the others keep Megatron's defaults (tessera's equal them).
  for (const OptionDef& d : train_option_table().defs())
    if (const MegatronFlag* f = find_megatron_flag(d.flag); f && p.given(d.flag)) ns[f->dest] = typed(d, p);
  ns["tokenizer_type"] = a.tokenizer.type;
  // tessera's model is the local spec's; the files take Transformer Engine's layout only when
  // asked for (megatron_layer_spec.h), so that a save loads into the Megatron model of that flag.
  if (!p.given("--transformer-impl")) ns["transformer_impl"] = "local";
  ns["ckpt_format"] = "torch";
  apply_validate_args(ns, a);
  apply_training(ns, a, consumed_train_samples, consumed_valid_samples);
  return ns;
}

json megatron_scheduler_state(const LrScheduleConfig& c, int64_t num_steps) {
  return {{"max_lr", c.max_lr},
          {"lr_warmup_steps", c.warmup_steps},
          {"num_steps", num_steps},
          {"lr_decay_style", decay_style_name(c.decay_style)},
          {"lr_decay_steps", c.decay_steps},
          {"min_lr", c.min_lr},
          {"start_wd", c.start_wd},
          {"end_wd", c.end_wd},
          {"wd_incr_style", wd_style_name(c.wd_style)},
          {"wd_incr_steps", c.wd_incr_steps}};
}

bool same_megatron_schedule(const json& saved, const LrScheduleConfig& c) {
  const json want = megatron_scheduler_state(c, 0);
  for (const auto& [key, value] : want.items()) {
    if (key == "num_steps") continue;
    auto it = saved.find(key);
    if (it == saved.end()) return false;
    if (value.is_string() ? *it != value : !same_number(*it, value.get<double>())) return false;
  }
  return true;
}

LrScheduleConfig schedule_from_megatron(const json& saved, LrScheduleConfig c) {
  try {
    c.max_lr = saved.at("max_lr").get<double>();
    c.min_lr = saved.at("min_lr").get<double>();
    c.warmup_steps = static_cast<int64_t>(saved.at("lr_warmup_steps").get<double>());
    c.decay_steps = static_cast<int64_t>(saved.at("lr_decay_steps").get<double>());
    c.start_wd = saved.at("start_wd").get<double>();
    c.end_wd = saved.at("end_wd").get<double>();
    c.wd_incr_steps = static_cast<int64_t>(saved.at("wd_incr_steps").get<double>());
    const std::string decay = saved.at("lr_decay_style").get<std::string>();
    for (LrDecayStyle s : {LrDecayStyle::Constant, LrDecayStyle::Linear, LrDecayStyle::Cosine,
                           LrDecayStyle::InverseSquareRoot, LrDecayStyle::WSD})
      if (decay == decay_style_name(s)) c.decay_style = s;
    const std::string wd = saved.at("wd_incr_style").get<std::string>();
    for (WdIncrStyle s : {WdIncrStyle::Constant, WdIncrStyle::Linear, WdIncrStyle::Cosine})
      if (wd == wd_style_name(s)) c.wd_style = s;
  } catch (const json::exception& e) {
    throw runtime_error(std::string("the checkpoint's opt_param_scheduler lacks a setting: ") + e.what(),
                        "resume with --override-opt_param-scheduler to take the schedule from the flags");
  }
  return c;
}

std::vector<std::string> train_flags_from_megatron_args(const json& args) {
  static const char* const kModelDests[] = {
      "num_layers", "hidden_size", "num_attention_heads", "kv_channels", "ffn_hidden_size", "seq_length",
      "max_position_embeddings", "make_vocab_size_divisible_by", "normalization", "norm_epsilon",
      "position_embedding_type", "openai_gelu", "bias_gelu_fusion", "untie_embeddings_and_output_weights",
      "add_bias_linear", "add_qkv_bias", "swiglu", "group_query_attention", "num_query_groups", "rotary_base",
      "rotary_percent", "use_rope_scaling", "rope_scaling_factor", "tokenizer_type", "tokenizer_model",
      "vocab_size", "vocab_file", "merge_file", "init_method_std", "hidden_dropout", "attention_dropout", "fp16",
      "bf16", "tensor_model_parallel_size", "sequence_parallel", "pipeline_model_parallel_size", "num_experts",
      "moe_router_topk", "moe_router_pre_softmax", "moe_router_load_balancing_type", "moe_aux_loss_coeff",
      "moe_z_loss_coeff", "moe_ffn_hidden_size", "moe_layer_freq", "moe_shared_expert_intermediate_size",
      "moe_expert_capacity_factor", "moe_pad_expert_input_to_capacity", "moe_token_drop_policy",
      "moe_grouped_gemm"};
  std::vector<std::string> flags;
  for (const OptionDef& d : train_option_table().defs()) {
    const std::string dest = option_dest(d);
    if (std::find(std::begin(kModelDests), std::end(kModelDests), dest) == std::end(kModelDests)) continue;
    auto it = args.find(dest);
    if (it == args.end() || it->is_null()) continue;
    const json& v = *it;
    if (d.kind == OptKind::StoreTrue) {
      if (v.is_boolean() && v.get<bool>()) flags.push_back(d.flag);
    } else if (d.kind == OptKind::StoreFalse) {
      if (v.is_boolean() && !v.get<bool>()) flags.push_back(d.flag);
    } else if (v.is_number_integer()) {
      flags.insert(flags.end(), {d.flag, std::to_string(v.get<int64_t>())});
    } else if (v.is_number()) {
      flags.insert(flags.end(), {d.flag, python_float_repr(v.get<double>())});
    } else if (v.is_string()) {
      flags.insert(flags.end(), {d.flag, v.get<std::string>()});
    } else if (v.is_array() && dest == "moe_layer_freq") {
      flags.insert(flags.end(), {d.flag, v.dump()});  // "[1,0,1,0]"
    }
  }
  return flags;
}

}  // namespace tessera
