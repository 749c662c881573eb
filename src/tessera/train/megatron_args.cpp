#include "tessera/train/megatron_args.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <map>

#include "tessera/core/error.h"
#include "tessera/core/python_format.h"

namespace tessera {
namespace {

using json = nlohmann::json;

// A default literal of megatron_flags.inc as a value: None, True/False, numbers, quoted
// strings, []; expressions (2**32, os.getenv(...)) as None.
json python_literal(std::string_view s) {
  if (s.empty() || s == "None") return nullptr;
  if (s == "True") return true;
  if (s == "False") return false;
  if (s == "[]") return json::array();
  if (s.size() >= 2 && (s.front() == '\'' || s.front() == '"') && s.back() == s.front())
    return std::string(s.substr(1, s.size() - 2));
  const std::string text(s);
  char* end = nullptr;
  const long long i = std::strtoll(text.c_str(), &end, 10);
  if (*end == '\0') return static_cast<int64_t>(i);
  const double d = std::strtod(text.c_str(), &end);
  if (*end == '\0') return d;
  return nullptr;
}

std::string dest_of_flag(std::string_view flag) {
  std::string d(flag.substr(2));
  for (char& c : d)
    if (c == '-') c = '_';
  return d;
}

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

}  // namespace

json megatron_namespace(const TrainArgs& a, int64_t consumed_train_samples, int64_t consumed_valid_samples) {
  json ns = json::object();
#define MEGATRON_FLAG(name, kind, default_value) ns[dest_of_flag(name)] = python_literal(default_value);
#include "tessera/train/megatron_flags.inc"
#undef MEGATRON_FLAG
  std::vector<char*> argv;
  std::vector<std::string> line = a.command_line;
  for (std::string& s : line) argv.push_back(s.data());
  const ParsedOptions p = train_option_table().parse(static_cast<int>(argv.size()), argv.data());
  for (const OptionDef& d : train_option_table().defs()) ns[option_dest(d)] = typed(d, p);

  // What validate_args and the training loop derive.
  const GPTConfig& m = a.model;
  ns["num_layers"] = m.num_layers;
  ns["hidden_size"] = m.hidden_size;
  ns["num_attention_heads"] = m.num_attention_heads;
  ns["kv_channels"] = m.kv_channels;
  ns["ffn_hidden_size"] = m.ffn_hidden_size;
  ns["num_query_groups"] = m.query_groups();
  ns["padded_vocab_size"] = m.padded_vocab_size;
  ns["tokenizer_type"] = a.tokenizer.type;
  ns["position_embedding_type"] = m.position_embedding == PositionEmbedding::Rope   ? "rope"
                                  : m.position_embedding == PositionEmbedding::None ? "none"
                                                                                    : "learned_absolute";
  ns["tensor_model_parallel_size"] = a.tensor_parallel_size;
  ns["pipeline_model_parallel_size"] = a.pipeline_parallel_size;
  const int virtual_stages = a.pipeline_split.virtual_stages;
  ns["virtual_pipeline_model_parallel_size"] = virtual_stages > 1 ? json(virtual_stages) : json(nullptr);
  ns["num_layers_per_virtual_pipeline_stage"] =
      virtual_stages > 1 ? json(m.num_layers / (a.pipeline_parallel_size * virtual_stages)) : json(nullptr);
  ns["data_parallel_size"] = a.data_parallel_size;
  ns["world_size"] = a.world_size;
  ns["rank"] = 0;
  ns["micro_batch_size"] = a.micro_batch_size;
  ns["global_batch_size"] = a.global_batch_size;
  ns["train_iters"] = a.train_iters;
  ns["consumed_train_samples"] = consumed_train_samples;
  ns["skipped_train_samples"] = 0;
  ns["consumed_valid_samples"] = consumed_valid_samples;
  ns["transformer_impl"] = "local";
  ns["ckpt_format"] = "torch";
  ns["use_distributed_optimizer"] = a.use_distributed_optimizer;
  ns["params_dtype"] = {{"$global", a.bf16 ? "torch.bfloat16" : a.fp16 ? "torch.float16" : "torch.float32"}};
  ns["model_type"] = {{"$enum", "megatron.core.enums.ModelType"}, {"value", 1}};  // encoder_or_decoder
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
      "rotary_percent", "tokenizer_type", "vocab_size", "vocab_file", "merge_file", "init_method_std",
      "hidden_dropout", "attention_dropout", "fp16", "bf16", "tensor_model_parallel_size",
      "pipeline_model_parallel_size"};
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
    }
  }
  return flags;
}

}  // namespace tessera
