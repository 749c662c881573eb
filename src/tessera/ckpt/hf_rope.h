// RoPE in a Hugging Face config.json (the Llama family's; hf_llama.h), in both layouts
// transformers writes:
//   - transformers 4: top-level "rope_theta" and "rope_scaling" (null, or {"rope_type" (older
//     files: "type"), "factor", ...});
//   - transformers 5: "rope_parameters" {"rope_theta", "rope_type", ...} and no top-level
//     rope_theta (modeling_rope_utils.py, RotaryEmbeddingConfigMixin).
// A file with both must describe one model in each (transformers 4 reads only the first, 5
// prefers the second). rope_type "default" and "llama3" (Llama 3.1's scaling, Megatron's
// --use-rope-scaling with low/high frequency factors 1 and 4 and original context 8192) are
// read; any other type (linear, dynamic, yarn, longrope, ...) or other llama3 constants, and
// a partial_rotary_factor other than 1, are errors naming the field and its value. An export
// writes both layouts, so that transformers 4 and 5 load the same model.
#pragma once

#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "tessera/ckpt/hf_files.h"
#include "tessera/model/gpt_config.h"

namespace tessera {

struct HFRope {
  double theta = 10000.0;               // LlamaConfig's default
  std::optional<double> llama3_factor;  // rope_type "llama3": --use-rope-scaling --rope-scaling-factor
  bool operator==(const HFRope&) const = default;
};

HFRope read_hf_rope(const HFConfigFile& cfg);

// "rope_theta 500000, llama3 factor 32", for messages.
std::string rope_description(const HFRope& r);

// Sets config's rope_theta, rope_scaling and rope_parameters for `c`.
void write_hf_rope(nlohmann::json& config, const GPTConfig& c);

}  // namespace tessera
