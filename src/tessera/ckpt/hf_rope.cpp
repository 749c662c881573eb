#include "tessera/ckpt/hf_rope.h"

#include "tessera/core/error.h"

namespace tessera {

namespace {

using json = nlohmann::json;

// Megatron core_r0.10.0's constants of --use-rope-scaling (RotaryEmbedding._apply_scaling's
// defaults), which GPTConfig does not vary.
constexpr double kLowFreqFactor = 1.0, kHighFreqFactor = 4.0;
constexpr int64_t kOriginalMaxPositions = 8192;

// The number `params[name]` (config.json's field `field`), required.
double required_number(const HFConfigFile& cfg, const json& params, const std::string& field, const char* name) {
  auto it = params.find(name);
  if (it == params.end() || it->is_null())
    throw runtime_error(cfg.path() + ": " + field + " is absent, which rope_type \"llama3\" needs",
                        "is this config.json complete?");
  if (!it->is_number()) cfg.unsupported_value(field, *it, "not a number", "");
  return it->get<double>();
}

// A llama3 constant that tessera's RoPE (Megatron's) fixes: any other value is an error.
void require_megatron_constant(const HFConfigFile& cfg, const json& params, const std::string& key, const char* name,
                               double megatron) {
  const std::string field = key + "." + name;
  if (required_number(cfg, params, field, name) != megatron)
    cfg.unsupported_value(
        field, params.at(name),
        "but Megatron's --use-rope-scaling (and so tessera's) has " + std::string(name) + " " + hf_number(megatron),
        "only llama3 scaling with low_freq_factor 1, high_freq_factor 4 and "
        "original_max_position_embeddings 8192 (Llama 3.1 and 3.2) converts");
}

// RoPE as one layout states it: `params` is config.json's object `key` (nullptr when absent
// or null), `theta` the top-level rope_theta or its default.
HFRope rope_from(const HFConfigFile& cfg, const std::string& key, const json* params, double theta) {
  HFRope r;
  r.theta = theta;
  if (params == nullptr) return r;
  if (!params->is_object()) cfg.unsupported_value(key, *params, "expected an object", "");
  if (!params->contains("rope_type") && !params->contains("type") && !params->contains("rope_theta"))
    cfg.unsupported_value(key, *params, "which sets RoPE per layer type (or names no rope_type)",
                          "tessera reads one rope_type for every layer");
  if (auto it = params->find("rope_theta"); it != params->end() && !it->is_null()) {
    if (!it->is_number() || it->get<double>() <= 0)
      cfg.unsupported_value(key + ".rope_theta", *it, "not a positive number", "");
    r.theta = it->get<double>();
  }
  if (auto it = params->find("partial_rotary_factor"); it != params->end() && *it != 1.0)
    cfg.unsupported_value(key + ".partial_rotary_factor", *it, "but LlamaAttention rotates whole heads", "");
  const char* type_key = params->contains("rope_type") ? "rope_type" : "type";
  const json type = params->value(type_key, json("default"));
  if (type == "default") return r;
  if (type != "llama3")
    cfg.unsupported_value(key + "." + type_key, type,
                          "which tessera does not implement (Megatron core_r0.10.0's RoPE: \"default\", and "
                          "\"llama3\" with --use-rope-scaling)",
                          "only models with rope_type \"default\" or \"llama3\" convert");
  const double factor = required_number(cfg, *params, key + ".factor", "factor");
  if (!(factor >= 1.0)) cfg.unsupported_value(key + ".factor", params->at("factor"), "expected a factor >= 1", "");
  require_megatron_constant(cfg, *params, key, "low_freq_factor", kLowFreqFactor);
  require_megatron_constant(cfg, *params, key, "high_freq_factor", kHighFreqFactor);
  require_megatron_constant(cfg, *params, key, "original_max_position_embeddings", kOriginalMaxPositions);
  r.llama3_factor = factor;
  return r;
}

}  // namespace

HFRope read_hf_rope(const HFConfigFile& cfg) {
  const json& j = cfg.json();
  const double theta = cfg.number("rope_theta", 10000.0);
  const HFRope v4 = rope_from(cfg, "rope_scaling", cfg.has("rope_scaling") ? &j.at("rope_scaling") : nullptr, theta);
  if (!cfg.has("rope_parameters")) return v4;
  const HFRope v5 = rope_from(cfg, "rope_parameters", &j.at("rope_parameters"), theta);
  if ((cfg.has("rope_theta") || cfg.has("rope_scaling")) && v4 != v5)
    throw usage_error(cfg.path() + ": rope_parameters says " + rope_description(v5) +
                          " (what transformers 5 reads) but " + "rope_theta and rope_scaling say " +
                          rope_description(v4) + " (what transformers 4 reads)",
                      "make the two layouts agree, or keep one of them");
  return v5;
}

std::string rope_description(const HFRope& r) {
  std::string s = "rope_theta " + hf_number(r.theta);
  if (r.llama3_factor) s += ", rope_type llama3 factor " + hf_number(*r.llama3_factor);
  return s;
}

void write_hf_rope(json& config, const GPTConfig& c) {
  const double theta = hf_decimal(c.rotary_base);
  json scaling = nullptr, params = {{"rope_theta", theta}, {"rope_type", "default"}};
  if (c.use_rope_scaling) {
    scaling = {{"rope_type", "llama3"},
               {"factor", hf_decimal(c.rope_scaling_factor)},
               {"low_freq_factor", kLowFreqFactor},
               {"high_freq_factor", kHighFreqFactor},
               {"original_max_position_embeddings", kOriginalMaxPositions}};
    params = scaling;
    params["rope_theta"] = theta;
  }
  config["rope_theta"] = theta;
  config["rope_scaling"] = scaling;
  config["rope_parameters"] = params;
}

}  // namespace tessera
