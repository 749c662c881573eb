#include "tessera/ckpt/hf_llama.h"

#include <algorithm>
#include <map>
#include <string_view>

#include "tessera/ckpt/hf_moe.h"
#include "tessera/ckpt/hf_rope.h"
#include "tessera/core/error.h"
#include "tessera/core/log.h"

namespace tessera {

namespace {

using json = nlohmann::json;

// Which linear layers have biases: HF's q/k/v, o_proj and the MLP's; Megatron's linear_qkv
// (--add-qkv-bias), and linear_proj with fc1 and fc2 together (--add-bias-linear).
struct Biases {
  bool qkv = false, proj = false, mlp = false;
  bool operator==(const Biases&) const = default;
};

// What config.json says, with LlamaConfig's or Qwen2Config's defaults for absent keys.
struct LlamaShape {
  HFFamily family = HFFamily::Llama;
  int64_t layers = 0, hidden = 0, heads = 0, kv_heads = 0, head_dim = 0, ffn = 0, vocab = 0, positions = 0;
  double eps = 1e-6;
  HFRope rope;
  bool tied = false;
  Biases biases;
  HFMoEShape moe;  // Mixtral, Qwen2-MoE
};

// Llama-like attention (head_dim, attention_bias) or Qwen2-like (q/k/v biases, sliding window).
bool llama_like(HFFamily f) { return f == HFFamily::Llama || f == HFFamily::Mixtral; }

LlamaShape parse_llama_config(const HFConfigFile& j) {
  LlamaShape s;
  s.family = j.family();
  if (s.family == HFFamily::GPT2)
    j.unsupported("model_type", "expected \"llama\", \"qwen2\", \"mixtral\" or \"qwen2_moe\"",
                  "load_hf_model reads every family tessera converts");
  const bool llama = llama_like(s.family);
  s.layers = j.integer("num_hidden_layers");
  s.hidden = j.integer("hidden_size");
  s.heads = j.integer("num_attention_heads");
  s.kv_heads = j.integer("num_key_value_heads", s.heads);
  s.ffn = j.integer("intermediate_size");
  s.vocab = j.integer("vocab_size");
  s.positions = j.integer("max_position_embeddings", llama ? 2048 : 32768);
  if (s.hidden % s.heads != 0 && !(llama && j.has("head_dim")))
    throw runtime_error(j.path() + ": hidden_size " + std::to_string(s.hidden) + " is not divisible by "
                        "num_attention_heads " + std::to_string(s.heads));
  // Qwen2Attention's head dimension is always hidden_size / heads; LlamaAttention reads head_dim.
  s.head_dim = llama ? j.integer("head_dim", s.hidden / s.heads) : s.hidden / s.heads;
  if (s.heads % s.kv_heads != 0)
    throw runtime_error(j.path() + ": num_attention_heads " + std::to_string(s.heads) +
                        " is not divisible by num_key_value_heads " + std::to_string(s.kv_heads));
  s.eps = j.number("rms_norm_eps", 1e-6);
  s.rope = read_hf_rope(j);
  s.tied = j.boolean("tie_word_embeddings", false);

  // What Megatron's GPT cannot express.
  if (j.string("hidden_act", "silu") != "silu")
    j.unsupported("hidden_act", "but --swiglu gates with SiLU", "only hidden_act \"silu\" models convert");
  if (j.number("partial_rotary_factor", 1.0) != 1.0)
    j.unsupported("partial_rotary_factor", "but LlamaAttention rotates whole heads", "");
  if (is_hf_moe_family(s.family)) s.moe = parse_hf_moe(j, s.family, s.layers);
  if (s.family == HFFamily::Mixtral && j.has("sliding_window"))
    j.unsupported("sliding_window", "but tessera's attention is full causal attention",
                  "only models with sliding_window null convert");
  if (llama) {
    s.biases.qkv = s.biases.proj = j.boolean("attention_bias", false);
    s.biases.mlp = j.boolean("mlp_bias", false);
    if (s.biases.proj != s.biases.mlp)
      j.unsupported(s.biases.proj ? "attention_bias" : "mlp_bias",
                    "but Megatron's --add-bias-linear gives linear_qkv, linear_proj, fc1 and fc2 biases together",
                    "only models with attention_bias == mlp_bias convert");
  } else {
    s.biases.qkv = true;  // Qwen2Attention: q/k/v biases, none on o_proj or the MLP
    if (j.boolean("use_sliding_window", false))
      j.unsupported("use_sliding_window", "but tessera's attention is full causal attention",
                    "only models with use_sliding_window false convert");
    // transformers 5 lists each layer's attention; only full attention converts.
    if (j.has("layer_types"))
      for (const json& type : j.json().at("layer_types"))
        if (type != "full_attention")
          j.unsupported("layer_types", "but tessera's attention is full causal attention in every layer",
                        "only models whose layer_types are all \"full_attention\" convert");
  }
  return s;
}

// What to change in the flags to get `b`, for hints.
std::string bias_flags(const Biases& b) {
  if (b.mlp) return "drop --disable-bias-linear";
  return b.qkv ? "pass --disable-bias-linear --add-qkv-bias" : "pass --disable-bias-linear (without --add-qkv-bias)";
}

Biases flag_biases(const GPTConfig& c) { return {c.has_qkv_bias(), c.add_bias_linear, c.add_bias_linear}; }

// The key/value heads: GQA's groups need --group-query-attention as well as --num-query-groups
// (without it every head has its own key and value, whatever --num-query-groups says).
void check_query_groups(HFFlagCheck& check, const LlamaShape& h, const GPTConfig& c) {
  if (h.kv_heads == c.query_groups()) return;
  if (c.query_groups() == c.num_attention_heads)
    check.differ("num_key_value_heads is " + std::to_string(h.kv_heads) + " but the flags give each of the " +
                     std::to_string(c.num_attention_heads) + " heads its own key and value (no "
                     "--group-query-attention, or --num-query-groups " + std::to_string(c.num_attention_heads) + ")",
                 "pass --group-query-attention --num-query-groups " + std::to_string(h.kv_heads));
  else
    check.equal("num_key_value_heads", h.kv_heads, "--num-query-groups", c.query_groups());
}

// RoPE's base and Llama 3.1's scaling (rope_type llama3: --use-rope-scaling).
void check_rope(HFFlagCheck& check, const LlamaShape& h, const GPTConfig& c) {
  check.close("rope_theta", h.rope.theta, "--rotary-base", c.rotary_base);
  const std::optional<double>& factor = h.rope.llama3_factor;
  if (factor && !c.use_rope_scaling)
    check.differ("rope_type is \"llama3\" (Llama 3.1's scaling) but --use-rope-scaling is not given",
                 "pass --use-rope-scaling --rope-scaling-factor " + hf_number(*factor));
  else if (!factor && c.use_rope_scaling)
    check.differ("rope_type is \"default\" (no scaling) but --use-rope-scaling is given", "drop --use-rope-scaling");
  else if (factor)
    check.close("rope_scaling factor", *factor, "--rope-scaling-factor", c.rope_scaling_factor);
}

void check_llama_config(const LlamaShape& h, const GPTConfig& c, const HFConfigFile& j) {
  const std::string model = std::string("a ") + hf_family_name(h.family) + " model";
  HFFlagCheck check(j);
  if (c.normalization != Normalization::RMSNorm)
    check.differ(model + " (RMSNorm) but the flags select LayerNorm", "pass --normalization RMSNorm");
  if (c.position_embedding != PositionEmbedding::Rope)
    check.differ(model + " (rotary positions) but the flags select other position embeddings",
                 "pass --position-embedding-type rope");
  if (!c.swiglu) check.differ(model + " (SwiGLU MLP) but --swiglu is not given", "pass --swiglu");
  check.equal("num_hidden_layers", h.layers, "--num-layers", c.num_layers);
  check.equal("hidden_size", h.hidden, "--hidden-size", c.hidden_size);
  check.equal("num_attention_heads", h.heads, "--num-attention-heads", c.num_attention_heads);
  check_query_groups(check, h, c);
  check.equal("head_dim", h.head_dim, "--kv-channels", c.kv_channels);
  // Mixtral's intermediate_size is its experts'; Qwen2-MoE's that of its dense layers.
  const bool dense_layers = std::find(h.moe.moe_layers.begin(), h.moe.moe_layers.end(), false) != h.moe.moe_layers.end();
  if (!is_hf_moe_family(h.family) || (h.family == HFFamily::Qwen2Moe && dense_layers))
    check.equal("intermediate_size", h.ffn, "--ffn-hidden-size", c.ffn_hidden_size);
  if (is_hf_moe_family(h.family))
    check_hf_moe(check, h.moe, h.family, c);
  else if (c.moe.enabled())
    check.differ(model + " (dense) but --num-experts is given", "drop --num-experts");
  check.close("rms_norm_eps", h.eps, "--norm-epsilon", c.norm_epsilon);
  check_rope(check, h, c);
  if (c.rotary_percent != 1.0f)
    check.differ(model + " rotates whole heads but --rotary-percent is " + hf_number(hf_decimal(c.rotary_percent)),
                 "drop --rotary-percent");
  if (h.biases != flag_biases(c))
    check.differ("the biases of " + model + " (attention_bias / mlp_bias / model_type) differ from those of the flags",
                 bias_flags(h.biases));
  if (!h.tied && !c.untie_embeddings_and_output_weights)
    check.differ("tie_word_embeddings is false (lm_head differs from embed_tokens) but the output layer is tied to "
                 "the embedding",
                 "pass --untie-embeddings-and-output-weights");
  check_vocab_fits(check, j, h.vocab, c);
  check.done();
  if (c.seq_length > h.positions)
    log_warn("%s: --seq-length %d exceeds max_position_embeddings %lld, the longest sequence the model was made for",
             j.path().c_str(), c.seq_length, static_cast<long long>(h.positions));
}

// Megatron's linear_qkv row of channel d of HF head `head` of q (part 0), k (1) or v (2): rows
// are grouped per query group g as [q of its heads; k_g; v_g] (attention.py's
// get_query_key_value_tensors); R query heads share a group.
int64_t grouped_qkv_row(int part, int64_t head, int64_t d, int64_t R, int64_t hd) {
  const int64_t g = part == 0 ? head / R : head;
  const int64_t slot = part == 0 ? head % R : R + part - 1;
  return (g * (R + 2) + slot) * hd + d;
}

// (model.)layers.<digits>.self_attn.rotary_emb.inv_freq: a buffer older transformers saved.
bool is_rope_buffer(std::string_view n) { return n.ends_with(".self_attn.rotary_emb.inv_freq"); }

}  // namespace

std::map<std::string, std::vector<float>> load_hf_llama(const std::string& dir, const GPTConfig& config) {
  const HFConfigFile j = HFConfigFile::read(dir);
  const LlamaShape h = parse_llama_config(j);
  check_llama_config(h, config, j);
  HFWeights f = HFWeights::open(dir, "model.");

  const int64_t H = config.hidden_size, F = config.ffn_hidden_size, NH = config.num_attention_heads,
                NG = config.query_groups(), hd = config.kv_channels, R = NH / NG, V = h.vocab,
                Vp = config.padded_vocab_size;
  std::map<std::string, std::vector<float>> out;
  const std::vector<float> embed = f.get("embed_tokens.weight", {V, H}, "embedding.word_embeddings.weight");
  out["embedding.word_embeddings.weight"] = pad_rows(embed, Vp, H);

  for (int l = 0; l < config.num_layers; ++l) {
    const std::string hp = "layers." + std::to_string(l) + ".";
    const std::string mp = "decoder.layers." + std::to_string(l) + ".";
    auto copy = [&](const std::string& hname, const Shape& shape, const std::string& mname) {
      out[mp + mname] = f.get(hp + hname, shape, mp + mname);
    };
    copy("input_layernorm.weight", {H}, "input_layernorm.weight");

    // q, k, v (weights [rows, H], biases [rows]) into the grouped rows of linear_qkv.
    auto grouped = [&](const char* suffix, int64_t cols) {
      const std::string mname = mp + "self_attention.linear_qkv." + suffix;
      std::vector<float> qkv(static_cast<size_t>((NH + 2 * NG) * hd * cols));
      const char* projs[] = {"q_proj.", "k_proj.", "v_proj."};
      for (int part = 0; part < 3; ++part) {
        const int64_t heads = part == 0 ? NH : NG;
        const Shape shape = cols == 1 ? Shape{heads * hd} : Shape{heads * hd, cols};
        const std::vector<float> src = f.get(hp + "self_attn." + projs[part] + suffix, shape, mname);
        for (int64_t head = 0; head < heads; ++head)
          for (int64_t d = 0; d < hd; ++d)
            std::copy_n(src.begin() + (head * hd + d) * cols, cols,
                        qkv.begin() + grouped_qkv_row(part, head, d, R, hd) * cols);
      }
      out[mname] = std::move(qkv);
    };
    grouped("weight", H);
    if (h.biases.qkv) grouped("bias", 1);
    copy("self_attn.o_proj.weight", {H, NH * hd}, "self_attention.linear_proj.weight");
    if (h.biases.proj) copy("self_attn.o_proj.bias", {H}, "self_attention.linear_proj.bias");
    copy("post_attention_layernorm.weight", {H}, "pre_mlp_layernorm.weight");
    if (config.moe.is_moe_layer(l)) {
      load_hf_moe_mlp(out, f, h.family, hp, mp, config);
      continue;
    }

    // gate_proj then up_proj: linear_fc1 [2, F, H] (its bias [2, F]).
    auto gate_up = [&](const char* suffix, int64_t cols) {
      const std::string mname = mp + "mlp.linear_fc1." + suffix;
      const Shape shape = cols == 1 ? Shape{F} : Shape{F, cols};
      std::vector<float> fc1 = f.get(hp + "mlp.gate_proj." + suffix, shape, mname);
      const std::vector<float> up = f.get(hp + "mlp.up_proj." + suffix, shape, mname);
      fc1.insert(fc1.end(), up.begin(), up.end());
      out[mname] = std::move(fc1);
    };
    gate_up("weight", H);
    if (h.biases.mlp) gate_up("bias", 1);
    copy("mlp.down_proj.weight", {H, F}, "mlp.linear_fc2.weight");
    if (h.biases.mlp) copy("mlp.down_proj.bias", {H}, "mlp.linear_fc2.bias");
  }
  out["decoder.final_layernorm.weight"] = f.get("norm.weight", {H}, "decoder.final_layernorm.weight");

  // lm_head.weight sits beside `model.`, not under it.
  if (!h.tied) {
    out["output_layer.weight"] = pad_rows(f.get("lm_head.weight", {V, H}, "output_layer.weight"), Vp, H);
  } else {
    if (f.contains("lm_head.weight") &&
        f.get("lm_head.weight", {V, H}, "output_layer.weight (tied to the embedding)") != embed)
      throw usage_error(dir + ": lm_head.weight differs from embed_tokens.weight but config.json says "
                        "tie_word_embeddings true", "fix tie_word_embeddings in config.json");
    if (config.untie_embeddings_and_output_weights) out["output_layer.weight"] = out["embedding.word_embeddings.weight"];
  }
  f.check_all_read(is_rope_buffer, std::string("a ") + hf_family_name(h.family) + " model with " +
                                       std::to_string(config.num_layers) + " layers");
  check_param_list(out, config, hf_family_name(h.family));
  return out;
}

bool is_llama_family(const GPTConfig& c) {
  return c.normalization == Normalization::RMSNorm || c.position_embedding != PositionEmbedding::LearnedAbsolute ||
         c.swiglu;
}

void check_dense_expressible(const GPTConfig& c);

HFFamily check_llama_expressible(const GPTConfig& c) {
  if (c.moe.enabled()) {
    const HFFamily family = check_hf_moe_expressible(c);
    check_dense_expressible(c);
    return family;
  }
  check_dense_expressible(c);
  const bool qwen2 = !c.add_bias_linear && c.add_qkv_bias;
  if (qwen2 && int64_t{c.kv_channels} * c.num_attention_heads != c.hidden_size)
    throw usage_error("export-hf: --kv-channels × heads differs from --hidden-size with --add-qkv-bias (Qwen2's head "
                      "dimension is hidden_size / heads); Qwen2ForCausalLM cannot express it",
                      "train with the default --kv-channels");
  return qwen2 ? HFFamily::Qwen2 : HFFamily::Llama;
}

// What every Llama-family export needs (RMSNorm, RoPE over whole heads, SwiGLU, the vocabulary).
void check_dense_expressible(const GPTConfig& c) {
  auto inexpressible = [](const std::string& what, const std::string& hint) {
    throw usage_error("export-hf: " + what + "; LlamaForCausalLM and Qwen2ForCausalLM cannot express it", hint);
  };
  if (c.normalization != Normalization::RMSNorm) inexpressible("the model uses LayerNorm", "train with --normalization RMSNorm");
  if (c.position_embedding != PositionEmbedding::Rope)
    inexpressible("the model has no rotary position embedding", "train with --position-embedding-type rope");
  if (!c.swiglu) inexpressible("the model's MLP is not SwiGLU", "train with --swiglu");
  if (c.rotary_percent != 1.0f)
    inexpressible("--rotary-percent " + std::to_string(c.rotary_percent) + " rotates part of each head",
                  "train without --rotary-percent");
  if (c.vocab_size <= 0 || c.vocab_size > c.padded_vocab_size)
    throw runtime_error("export-hf: the tokenizer's vocabulary (" + std::to_string(c.vocab_size) +
                        ") does not fit the padded vocabulary (" + std::to_string(c.padded_vocab_size) + ")");
}

json llama_config_json(const HFExportSpec& spec) {
  const GPTConfig& c = spec.model;
  const HFFamily family = check_llama_expressible(c);
  const bool qwen2 = !llama_like(family);
  static const std::map<HFFamily, std::pair<const char*, const char*>> kNames = {
      {HFFamily::Llama, {"LlamaForCausalLM", "llama"}},
      {HFFamily::Qwen2, {"Qwen2ForCausalLM", "qwen2"}},
      {HFFamily::Mixtral, {"MixtralForCausalLM", "mixtral"}},
      {HFFamily::Qwen2Moe, {"Qwen2MoeForCausalLM", "qwen2_moe"}}};
  json j = {
      {"architectures", json::array({kNames.at(family).first})},
      {"model_type", kNames.at(family).second},
      {"vocab_size", c.vocab_size},
      {"hidden_size", c.hidden_size},
      {"intermediate_size", c.ffn_hidden_size},
      {"num_hidden_layers", c.num_layers},
      {"num_attention_heads", c.num_attention_heads},
      {"num_key_value_heads", c.query_groups()},
      {"hidden_act", "silu"},
      {"max_position_embeddings", std::max(c.max_position_embeddings, c.seq_length)},
      {"initializer_range", hf_decimal(c.init_method_std)},
      {"rms_norm_eps", hf_decimal(c.norm_epsilon)},
      {"attention_dropout", hf_decimal(c.attention_dropout)},
      {"tie_word_embeddings", !c.untie_embeddings_and_output_weights},
      {"use_cache", true},
      {"torch_dtype", "float32"},  // transformers 4's name
      {"dtype", "float32"},        // transformers 5's
  };
  write_hf_rope(j, c);
  if (qwen2) {
    j["use_sliding_window"] = false;
    j["sliding_window"] = nullptr;
    j["max_window_layers"] = c.num_layers;
  } else {
    j["head_dim"] = c.kv_channels;
    if (family == HFFamily::Llama) {
      j["attention_bias"] = c.add_bias_linear;
      j["mlp_bias"] = c.add_bias_linear;
      j["pretraining_tp"] = 1;
    }
  }
  if (is_hf_moe_family(family)) write_hf_moe_config(j, family, c);
  write_special_token_ids(j, spec);
  return j;
}

std::vector<HFTensor> megatron_to_hf_llama(const std::map<std::string, std::vector<float>>& w, const GPTConfig& c) {
  const HFFamily family = check_llama_expressible(c);
  const int64_t H = c.hidden_size, F = c.ffn_hidden_size, NH = c.num_attention_heads, NG = c.query_groups(),
                hd = c.kv_channels, R = NH / NG, V = c.vocab_size, Vp = c.padded_vocab_size, QKV = c.qkv_width();
  std::vector<HFTensor> out;
  auto first_rows = [&](const std::string& name, int64_t rows) {
    const std::vector<float>& src = checkpoint_param(w, name, Vp * H);
    return std::vector<float>(src.begin(), src.begin() + rows * H);
  };
  out.push_back({"model.embed_tokens.weight", {V, H}, first_rows("embedding.word_embeddings.weight", V)});
  for (int l = 0; l < c.num_layers; ++l) {
    const std::string hp = "model.layers." + std::to_string(l) + ".";
    const std::string mp = "decoder.layers." + std::to_string(l) + ".";
    auto copy = [&](const std::string& mname, const Shape& shape, const std::string& hname) {
      int64_t n = 1;
      for (int64_t d : shape) n *= d;
      out.push_back({hp + hname, shape, checkpoint_param(w, mp + mname, n)});
    };
    copy("input_layernorm.weight", {H}, "input_layernorm.weight");
    // linear_qkv's grouped rows back into q_proj, k_proj, v_proj.
    auto ungroup = [&](const char* suffix, int64_t cols) {
      const std::vector<float>& qkv = checkpoint_param(w, mp + "self_attention.linear_qkv." + suffix, QKV * cols);
      const char* projs[] = {"q_proj.", "k_proj.", "v_proj."};
      for (int part = 0; part < 3; ++part) {
        const int64_t heads = part == 0 ? NH : NG;
        std::vector<float> dst(static_cast<size_t>(heads * hd * cols));
        for (int64_t head = 0; head < heads; ++head)
          for (int64_t d = 0; d < hd; ++d)
            std::copy_n(qkv.begin() + grouped_qkv_row(part, head, d, R, hd) * cols, cols,
                        dst.begin() + (head * hd + d) * cols);
        const Shape shape = cols == 1 ? Shape{heads * hd} : Shape{heads * hd, cols};
        out.push_back({hp + "self_attn." + projs[part] + suffix, shape, std::move(dst)});
      }
    };
    ungroup("weight", H);
    if (c.has_qkv_bias()) ungroup("bias", 1);
    copy("self_attention.linear_proj.weight", {H, NH * hd}, "self_attn.o_proj.weight");
    if (c.add_bias_linear) copy("self_attention.linear_proj.bias", {H}, "self_attn.o_proj.bias");
    copy("pre_mlp_layernorm.weight", {H}, "post_attention_layernorm.weight");
    if (c.moe.is_moe_layer(l)) {
      hf_moe_mlp_tensors(out, w, family, hp, mp, c);
      continue;
    }
    // linear_fc1 [2, F, H]: [0] gate_proj, [1] up_proj.
    auto split = [&](const char* suffix, int64_t cols) {
      const std::vector<float>& fc1 = checkpoint_param(w, mp + "mlp.linear_fc1." + suffix, 2 * F * cols);
      const Shape shape = cols == 1 ? Shape{F} : Shape{F, cols};
      out.push_back({hp + "mlp.gate_proj." + suffix, shape, std::vector<float>(fc1.begin(), fc1.begin() + F * cols)});
      out.push_back({hp + "mlp.up_proj." + suffix, shape, std::vector<float>(fc1.begin() + F * cols, fc1.end())});
    };
    split("weight", H);
    if (c.add_bias_linear) split("bias", 1);
    copy("mlp.linear_fc2.weight", {H, F}, "mlp.down_proj.weight");
    if (c.add_bias_linear) copy("mlp.linear_fc2.bias", {H}, "mlp.down_proj.bias");
  }
  out.push_back({"model.norm.weight", {H}, checkpoint_param(w, "decoder.final_layernorm.weight", H)});
  // A tied output layer is tie_word_embeddings true and no lm_head.weight, as save_pretrained writes it.
  if (c.untie_embeddings_and_output_weights)
    out.push_back({"lm_head.weight", {V, H}, first_rows("output_layer.weight", V)});
  return out;
}

std::vector<std::string> llama_train_flags(const HFConfigFile& cfg) {
  const LlamaShape h = parse_llama_config(cfg);
  std::vector<std::string> f = {"--num-layers", std::to_string(h.layers),
                                "--hidden-size", std::to_string(h.hidden),
                                "--num-attention-heads", std::to_string(h.heads),
                                "--ffn-hidden-size", std::to_string(h.ffn),
                                "--seq-length", std::to_string(h.positions),
                                "--max-position-embeddings", std::to_string(h.positions),
                                "--position-embedding-type", "rope",
                                "--rotary-base", hf_number(h.rope.theta)};
  if (h.rope.llama3_factor)
    f.insert(f.end(), {"--use-rope-scaling", "--rope-scaling-factor", hf_number(*h.rope.llama3_factor)});
  f.insert(f.end(), {"--normalization", "RMSNorm", "--norm-epsilon", hf_number(h.eps), "--swiglu"});
  if (h.kv_heads != h.heads)
    f.insert(f.end(), {"--group-query-attention", "--num-query-groups", std::to_string(h.kv_heads)});
  if (h.head_dim * h.heads != h.hidden) f.insert(f.end(), {"--kv-channels", std::to_string(h.head_dim)});
  if (!h.biases.mlp) f.push_back("--disable-bias-linear");
  if (h.biases.qkv && !h.biases.mlp) f.push_back("--add-qkv-bias");
  if (!h.tied) f.push_back("--untie-embeddings-and-output-weights");
  if (is_hf_moe_family(h.family)) {
    const std::vector<std::string> moe = hf_moe_train_flags(h.moe);
    f.insert(f.end(), moe.begin(), moe.end());
  }
  f.insert(f.end(), {"--tokenizer-type", "NullTokenizer", "--vocab-size", std::to_string(h.vocab - 1)});
  return f;
}

}  // namespace tessera
