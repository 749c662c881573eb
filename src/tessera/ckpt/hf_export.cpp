#include "tessera/ckpt/hf_export.h"


#include <cstdio>
#include <filesystem>

#include "tessera/ckpt/checkpoint.h"
#include "tessera/ckpt/hf_gpt2.h"
#include "tessera/ckpt/hf_llama.h"
#include "tessera/ckpt/safetensors.h"
#include "tessera/core/error.h"
#include "tessera/core/file_io.h"

namespace tessera {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

// Megatron [out, in] -> HF Conv1D [in, out].
std::vector<float> transpose(const std::vector<float>& w, int64_t out, int64_t in) {
  std::vector<float> r(w.size());
  for (int64_t o = 0; o < out; ++o)
    for (int64_t i = 0; i < in; ++i) r[i * out + o] = w[o * in + i];
  return r;
}

}  // namespace

void check_gpt2_expressible(const GPTConfig& c) {
  if (c.normalization != Normalization::LayerNorm || c.position_embedding != PositionEmbedding::LearnedAbsolute ||
      c.swiglu)
    throw usage_error("export-hf: GPT-2 has LayerNorm, learned absolute positions and a GELU MLP, but the model "
                      "mixes them with Llama's (--normalization, --position-embedding-type, --swiglu)",
                      "export models that are wholly GPT-2 or wholly Llama-shaped");
  if (c.query_groups() != c.num_attention_heads)
    throw usage_error("export-hf: the model has --num-query-groups " + std::to_string(c.query_groups()) +
                          "; GPT-2 has one key/value head per query head",
                      "export grouped-query models as Llama (--normalization RMSNorm "
                      "--position-embedding-type rope --swiglu)");
  if (!c.add_bias_linear)
    throw usage_error("export-hf: the model was trained with --disable-bias-linear; GPT-2 has biases in every "
                      "linear layer and its format cannot express a model without them",
                      "export models trained without --disable-bias-linear");
  if (static_cast<int64_t>(c.kv_channels) * c.num_attention_heads != c.hidden_size)
    throw usage_error("export-hf: --kv-channels " + std::to_string(c.kv_channels) + " × " +
                          std::to_string(c.num_attention_heads) + " heads is " +
                          std::to_string(static_cast<int64_t>(c.kv_channels) * c.num_attention_heads) +
                          ", not --hidden-size " + std::to_string(c.hidden_size) +
                          "; GPT-2's head dimension is always n_embd / n_head",
                      "export models whose --kv-channels is hidden-size / num-attention-heads");
  if (c.vocab_size <= 0 || c.vocab_size > c.padded_vocab_size)
    throw runtime_error("export-hf: the tokenizer's vocabulary (" + std::to_string(c.vocab_size) +
                        ") does not fit the padded vocabulary (" + std::to_string(c.padded_vocab_size) + ")");
}

json gpt2_config_json(const HFExportSpec& spec) {
  const GPTConfig& c = spec.model;
  json j = {
      {"architectures", json::array({"GPT2LMHeadModel"})},
      {"model_type", "gpt2"},
      {"vocab_size", c.vocab_size},
      {"n_positions", c.max_position_embeddings},
      {"n_ctx", c.max_position_embeddings},
      {"n_embd", c.hidden_size},
      {"n_layer", c.num_layers},
      {"n_head", c.num_attention_heads},
      {"n_inner", c.ffn_hidden_size == 4 * c.hidden_size ? json(nullptr) : json(c.ffn_hidden_size)},
      {"activation_function", c.gelu == ops::GeluKind::Tanh ? "gelu_new" : "gelu"},
      {"layer_norm_epsilon", hf_decimal(c.norm_epsilon)},
      {"initializer_range", hf_decimal(c.init_method_std)},
      {"resid_pdrop", hf_decimal(c.hidden_dropout)},
      {"embd_pdrop", hf_decimal(c.hidden_dropout)},
      {"attn_pdrop", hf_decimal(c.attention_dropout)},
      {"scale_attn_weights", true},
      {"scale_attn_by_inverse_layer_idx", false},
      {"reorder_and_upcast_attn", false},
      {"tie_word_embeddings", !c.untie_embeddings_and_output_weights},
      {"use_cache", true},
      {"torch_dtype", "float32"},  // transformers 4's name
      {"dtype", "float32"},        // transformers 5's
  };
  write_special_token_ids(j, spec);
  return j;
}

std::vector<HFTensor> megatron_to_hf_gpt2(const std::map<std::string, std::vector<float>>& w, const GPTConfig& c) {
  check_gpt2_expressible(c);
  const int64_t H = c.hidden_size, F = c.ffn_hidden_size, heads = c.num_attention_heads, hd = c.kv_channels,
                A = heads * hd, V = c.vocab_size, Vp = c.padded_vocab_size, P = c.max_position_embeddings;
  std::vector<HFTensor> out;
  auto first_rows = [&](const std::string& name, int64_t rows) {
    const std::vector<float>& src = checkpoint_param(w, name, static_cast<size_t>(Vp * H));
    return std::vector<float>(src.begin(), src.begin() + rows * H);
  };
  out.push_back({"transformer.wte.weight", {V, H}, first_rows("embedding.word_embeddings.weight", V)});
  out.push_back({"transformer.wpe.weight", {P, H}, checkpoint_param(w, "embedding.position_embeddings.weight", P * H)});
  for (int l = 0; l < c.num_layers; ++l) {
    const std::string hp = "transformer.h." + std::to_string(l) + ".";
    const std::string mp = "decoder.layers." + std::to_string(l) + ".";
    auto vec = [&](const std::string& mname, int64_t n, const std::string& hname) {
      out.push_back({hp + hname, {n}, checkpoint_param(w, mp + mname, n)});
    };
    auto linear = [&](const std::string& mname, int64_t o, int64_t in, const std::string& hname) {
      out.push_back({hp + hname, {in, o}, transpose(checkpoint_param(w, mp + mname, o * in), o, in)});
    };
    vec("input_layernorm.weight", H, "ln_1.weight");
    vec("input_layernorm.bias", H, "ln_1.bias");
    // Per-head rows [q_h; k_h; v_h] -> columns [Q; K; V].
    const std::vector<float>& qw = checkpoint_param(w, mp + "self_attention.linear_qkv.weight", 3 * A * H);
    const std::vector<float>& qb = checkpoint_param(w, mp + "self_attention.linear_qkv.bias", 3 * A);
    std::vector<float> cw(static_cast<size_t>(H * 3 * A)), cb(static_cast<size_t>(3 * A));
    for (int64_t head = 0; head < heads; ++head)
      for (int64_t part = 0; part < 3; ++part)
        for (int64_t d = 0; d < hd; ++d) {
          const int64_t row = head * 3 * hd + part * hd + d, col = part * A + head * hd + d;
          cb[col] = qb[row];
          for (int64_t j = 0; j < H; ++j) cw[j * 3 * A + col] = qw[row * H + j];
        }
    out.push_back({hp + "attn.c_attn.weight", {H, 3 * A}, std::move(cw)});
    out.push_back({hp + "attn.c_attn.bias", {3 * A}, std::move(cb)});
    linear("self_attention.linear_proj.weight", H, A, "attn.c_proj.weight");
    vec("self_attention.linear_proj.bias", H, "attn.c_proj.bias");
    vec("pre_mlp_layernorm.weight", H, "ln_2.weight");
    vec("pre_mlp_layernorm.bias", H, "ln_2.bias");
    linear("mlp.linear_fc1.weight", F, H, "mlp.c_fc.weight");
    vec("mlp.linear_fc1.bias", F, "mlp.c_fc.bias");
    linear("mlp.linear_fc2.weight", H, F, "mlp.c_proj.weight");
    vec("mlp.linear_fc2.bias", H, "mlp.c_proj.bias");
  }
  out.push_back({"transformer.ln_f.weight", {H}, checkpoint_param(w, "decoder.final_layernorm.weight", H)});
  out.push_back({"transformer.ln_f.bias", {H}, checkpoint_param(w, "decoder.final_layernorm.bias", H)});
  if (c.untie_embeddings_and_output_weights)
    out.push_back({"lm_head.weight", {V, H}, first_rows("output_layer.weight", V)});
  return out;
}

std::map<std::string, std::vector<float>> load_hf_model(const std::string& dir, const GPTConfig& c) {
  return HFConfigFile::read(dir).family() == HFFamily::GPT2 ? load_hf_gpt2(dir, c) : load_hf_llama(dir, c);
}

void check_hf_expressible(const GPTConfig& c) {
  if (is_llama_family(c))
    check_llama_expressible(c);
  else
    check_gpt2_expressible(c);
}

void write_hf_model(const std::string& out_dir, const HFExportSpec& spec,
                    const std::map<std::string, std::vector<float>>& weights) {
  const bool llama = is_llama_family(spec.model);
  std::vector<HFTensor> tensors =
      llama ? megatron_to_hf_llama(weights, spec.model) : megatron_to_hf_gpt2(weights, spec.model);
  std::error_code ec;
  fs::create_directories(out_dir, ec);
  if (ec) throw runtime_error("cannot create " + out_dir + ": " + ec.message(), "check that the path is writable");
  std::vector<safetensors::WriteEntry> entries;
  for (const HFTensor& t : tensors) entries.push_back({t.name, DType::F32, t.shape, t.data.data()});
  safetensors::write((fs::path(out_dir) / "model.safetensors").string(), entries, {{"format", "pt"}});
  for (const auto& [name, src] : spec.tokenizer_files)
    write_file_atomic((fs::path(out_dir) / name).string(), read_file(src));
  const json config = llama ? llama_config_json(spec) : gpt2_config_json(spec);
  write_file_atomic((fs::path(out_dir) / "config.json").string(), config.dump(2) + "\n");
}

std::map<std::string, std::vector<float>> read_checkpoint_model(const std::string& dir, int64_t iteration,
                                                                const GPTConfig& c) {
  std::map<std::string, std::vector<float>> weights;
  std::vector<NamedTensor> model;
  for (const ParamSpec& s : gpt_param_specs(c)) {
    int64_t n = 1;
    for (int64_t d : s.shape) n *= d;
    std::vector<float>& v = weights[s.name];
    v.assign(static_cast<size_t>(n), 0.0f);
    model.push_back({s.name, Tensor(v.data(), DType::F32, s.shape, nullptr)});
  }
  load_checkpoint(dir, iteration, model, {}, false);
  return weights;
}

std::vector<std::string> train_flags_from_hf_config(const std::string& hf_dir) {
  const HFConfigFile cfg = HFConfigFile::read(hf_dir);
  if (cfg.family() != HFFamily::GPT2) return llama_train_flags(cfg);
  const std::string& path = cfg.path();
  const json& j = cfg.json();
  auto integer = [&](const char* key) -> int64_t {
    auto it = j.find(key);
    if (it == j.end() || !it->is_number_integer() || it->get<int64_t>() <= 0)
      throw runtime_error(path + ": \"" + std::string(key) + "\" is missing or not a positive integer",
                          "is this a GPT-2 config.json?");
    return it->get<int64_t>();
  };
  const int64_t n_embd = integer("n_embd"), n_positions = integer("n_positions"), vocab = integer("vocab_size");
  std::vector<std::string> f = {"--num-layers", std::to_string(integer("n_layer")),
                                "--hidden-size", std::to_string(n_embd),
                                "--num-attention-heads", std::to_string(integer("n_head")),
                                "--seq-length", std::to_string(n_positions),
                                "--max-position-embeddings", std::to_string(n_positions)};
  if (auto it = j.find("n_inner"); it != j.end() && !it->is_null()) {
    const int64_t inner = integer("n_inner");
    if (inner != 4 * n_embd) f.insert(f.end(), {"--ffn-hidden-size", std::to_string(inner)});
  }
  if (auto it = j.find("layer_norm_epsilon"); it != j.end() && it->is_number()) {
    char eps[32];
    std::snprintf(eps, sizeof eps, "%.9g", it->get<double>());
    f.insert(f.end(), {"--norm-epsilon", eps});
  }
  if (auto it = j.find("activation_function"); it != j.end() && *it == "gelu") f.push_back("--no-bias-gelu-fusion");
  if (auto it = j.find("tie_word_embeddings"); it != j.end() && *it == false)
    f.push_back("--untie-embeddings-and-output-weights");
  const fs::path vocab_json = fs::absolute(fs::path(hf_dir) / "vocab.json");
  const fs::path merges = fs::absolute(fs::path(hf_dir) / "merges.txt");
  if (fs::exists(vocab_json) && fs::exists(merges))
    f.insert(f.end(), {"--tokenizer-type", "GPT2BPETokenizer", "--vocab-file", vocab_json.string(), "--merge-file",
                       merges.string()});
  else
    f.insert(f.end(), {"--tokenizer-type", "NullTokenizer", "--vocab-size", std::to_string(vocab - 1)});
  return f;
}

}  // namespace tessera
