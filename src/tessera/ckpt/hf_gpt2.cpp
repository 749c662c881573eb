#include "tessera/ckpt/hf_gpt2.h"

#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <sys/stat.h>

#include "tessera/ckpt/safetensors.h"
#include "tessera/core/log.h"

namespace tessera {

namespace {

using json = nlohmann::json;

bool file_exists(const std::string& p) {
  struct stat st {};
  return ::stat(p.c_str(), &st) == 0;
}

json read_config_json(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in)
    throw runtime_error(path + ": cannot open the Hugging Face config",
                        "--init-from-hf expects a folder with config.json and model.safetensors");
  std::stringstream ss;
  ss << in.rdbuf();
  json j = json::parse(ss.str(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object())
    throw runtime_error(path + ": not valid JSON, or not a JSON object",
                        "re-download or re-export the model");
  return j;
}

// What config.json says about the model, with GPT2Config's defaults for absent keys.
struct HFConfig {
  int64_t n_layer = 0, n_embd = 0, n_head = 0, n_positions = 0, vocab_size = 0, n_inner = 0;
  std::string activation = "gelu_new";
  double layer_norm_epsilon = 1e-5;
  bool tie_word_embeddings = true;
};

HFConfig parse_hf_config(const json& j, const std::string& path) {
  auto integer = [&](const char* key, bool required, int64_t dflt) -> int64_t {
    auto it = j.find(key);
    if (it == j.end() || it->is_null()) {
      if (required)
        throw runtime_error(path + ": missing \"" + std::string(key) + "\"",
                            "is this a GPT-2 config.json?");
      return dflt;
    }
    if (!it->is_number_integer() || it->get<int64_t>() <= 0 || it->get<int64_t>() > INT32_MAX)
      throw runtime_error(path + ": \"" + std::string(key) + "\" is " + it->dump() +
                          ", expected a positive 32-bit integer");
    return it->get<int64_t>();
  };
  auto boolean = [&](const char* key, bool dflt) -> bool {
    auto it = j.find(key);
    if (it == j.end() || it->is_null()) return dflt;
    if (!it->is_boolean())
      throw runtime_error(path + ": \"" + std::string(key) + "\" is " + it->dump() +
                          ", expected true or false");
    return it->get<bool>();
  };
  if (auto mt = j.find("model_type"); mt != j.end() && !(mt->is_string() && *mt == "gpt2"))
    throw usage_error(path + ": model_type is " + mt->dump() + ", expected \"gpt2\"",
                      "--init-from-hf loads GPT-2 (GPT2LMHeadModel) folders only");
  HFConfig c;
  c.n_layer = integer("n_layer", true, 0);
  c.n_embd = integer("n_embd", true, 0);
  c.n_head = integer("n_head", true, 0);
  c.n_positions = integer("n_positions", true, 0);
  c.vocab_size = integer("vocab_size", true, 0);
  c.n_inner = integer("n_inner", false, 4 * c.n_embd);
  if (auto a = j.find("activation_function"); a != j.end()) {
    if (!a->is_string()) throw runtime_error(path + ": \"activation_function\" is not a string");
    c.activation = a->get<std::string>();
  }
  if (auto e = j.find("layer_norm_epsilon"); e != j.end()) {
    if (!e->is_number()) throw runtime_error(path + ": \"layer_norm_epsilon\" is not a number");
    c.layer_norm_epsilon = e->get<double>();
  }
  c.tie_word_embeddings = boolean("tie_word_embeddings", true);
  // Variants GPT2Config allows that Megatron's GPT cannot express.
  if (!boolean("scale_attn_weights", true))
    throw usage_error(path + ": scale_attn_weights is false; Megatron's attention always scales by 1/sqrt(head dim)");
  if (boolean("scale_attn_by_inverse_layer_idx", false))
    throw usage_error(path + ": scale_attn_by_inverse_layer_idx is true; Megatron's GPT has no such scaling");
  if (boolean("add_cross_attention", false))
    throw usage_error(path + ": add_cross_attention is true; Megatron's GPT is decoder-only");
  return c;
}

void check_config(const HFConfig& h, const GPTConfig& c, const std::string& path) {
  auto mismatch = [&](const char* hf_key, int64_t hf, const char* flag, int64_t ours) {
    if (hf != ours)
      throw usage_error(path + ": " + hf_key + " is " + std::to_string(hf) + " but " + flag +
                            " is " + std::to_string(ours),
                        std::string("pass ") + flag + " " + std::to_string(hf) +
                            " to match the Hugging Face model");
  };
  mismatch("n_layer", h.n_layer, "--num-layers", c.num_layers);
  mismatch("n_embd", h.n_embd, "--hidden-size", c.hidden_size);
  mismatch("n_head", h.n_head, "--num-attention-heads", c.num_attention_heads);
  if (h.n_embd % h.n_head != 0)
    throw runtime_error(path + ": n_embd " + std::to_string(h.n_embd) +
                        " is not divisible by n_head " + std::to_string(h.n_head));
  mismatch("n_embd / n_head", h.n_embd / h.n_head, "--kv-channels", c.kv_channels);
  mismatch("n_inner", h.n_inner, "--ffn-hidden-size", c.ffn_hidden_size);
  // HF's wpe has n_positions rows; Megatron's position table has --max-position-embeddings.
  mismatch("n_positions", h.n_positions, "--max-position-embeddings", c.max_position_embeddings);
  if (h.vocab_size > c.padded_vocab_size)
    throw usage_error(path + ": vocab_size " + std::to_string(h.vocab_size) +
                          " exceeds the padded vocabulary of " + std::to_string(c.padded_vocab_size) +
                          " rows",
                      "use a tokenizer whose vocabulary covers the model's (--vocab-size or "
                      "--tokenizer-type), or raise --make-vocab-size-divisible-by");
  if (c.vocab_size > 0 && c.vocab_size > h.vocab_size)
    log_warn("%s: vocab_size is %lld but the tokenizer's vocabulary is %d; embedding rows %lld..%d "
             "start at zero",
             path.c_str(), static_cast<long long>(h.vocab_size), c.vocab_size,
             static_cast<long long>(h.vocab_size), c.vocab_size - 1);
  else if (c.vocab_size > 0 && c.vocab_size < h.vocab_size)
    log_warn("%s: vocab_size is %lld but the tokenizer's vocabulary is %d; the tokenizer never "
             "produces the model's tokens %d..%lld",
             path.c_str(), static_cast<long long>(h.vocab_size), c.vocab_size, c.vocab_size,
             static_cast<long long>(h.vocab_size - 1));

  ops::GeluKind hf_gelu;
  if (h.activation == "gelu_new" || h.activation == "gelu_pytorch_tanh" || h.activation == "gelu_fast")
    hf_gelu = ops::GeluKind::Tanh;
  else if (h.activation == "gelu")
    hf_gelu = ops::GeluKind::Erf;
  else
    throw usage_error(path + ": activation_function \"" + h.activation + "\" is not supported",
                      "Megatron's GPT uses GELU: gelu_new (tanh) or gelu (erf)");
  if (hf_gelu != c.gelu) {
    if (hf_gelu == ops::GeluKind::Tanh)
      throw usage_error(path + ": activation_function \"" + h.activation +
                            "\" is the tanh GELU but --no-bias-gelu-fusion selects the erf GELU",
                        "drop --no-bias-gelu-fusion (or pass --openai-gelu)");
    throw usage_error(path + ": activation_function \"gelu\" is the erf GELU but the flags select "
                      "the tanh GELU (bias-GELU fusion or --openai-gelu)",
                      "pass --no-bias-gelu-fusion and drop --openai-gelu");
  }
  const double eps = c.norm_epsilon;
  if (std::fabs(h.layer_norm_epsilon - eps) > 1e-5 * std::max(std::fabs(h.layer_norm_epsilon), std::fabs(eps))) {
    char buf[64];
    std::snprintf(buf, sizeof buf, "%g", h.layer_norm_epsilon);
    char ours[64];
    std::snprintf(ours, sizeof ours, "%g", eps);
    throw usage_error(path + ": layer_norm_epsilon is " + buf + " but --norm-epsilon is " + ours,
                      std::string("pass --norm-epsilon ") + buf);
  }
  if (!c.add_bias_linear)
    throw usage_error("GPT-2 has biases in every linear layer but --disable-bias-linear removes them",
                      "drop --disable-bias-linear");
  if (!h.tie_word_embeddings && !c.untie_embeddings_and_output_weights)
    throw usage_error(path + ": tie_word_embeddings is false (lm_head differs from wte) but the "
                      "output layer is tied to the embedding",
                      "pass --untie-embeddings-and-output-weights");
}

// The model.safetensors tensors, looked up by their GPT2Model name with or without the
// `transformer.` prefix; remembers which ones were used.
class HFTensors {
 public:
  explicit HFTensors(safetensors::Reader r) : r_(std::move(r)) {}

  const safetensors::Reader& reader() const { return r_; }

  // The file's name for `name`, or "" when absent.
  std::string resolve(const std::string& name) const {
    const std::string prefixed = "transformer." + name;
    const bool a = r_.contains(prefixed), b = r_.contains(name);
    if (a && b)
      throw runtime_error(r_.path() + ": holds both " + prefixed + " and " + name,
                          "keep one of the two; the file is ambiguous");
    return a ? prefixed : b ? name : "";
  }

  // Tensor `name` with exactly `shape`, as floats; `megatron` names what it becomes.
  std::vector<float> get(const std::string& name, const Shape& shape, const std::string& megatron) {
    std::string file_name = resolve(name);
    if (file_name.empty())
      throw runtime_error(r_.path() + ": missing tensor " + name + " (or transformer." + name +
                              "), expected shape " + shape_str(shape) + " for " + megatron,
                          "is this a GPT2LMHeadModel checkpoint matching config.json?");
    const safetensors::TensorInfo& t = r_.at(file_name);
    if (t.shape != shape)
      throw runtime_error(r_.path() + ": tensor " + file_name + " has shape " + shape_str(t.shape) +
                              " but the flags need " + shape_str(shape) + " (for " + megatron + ")",
                          "the tensor does not match config.json and the flags");
    used_.insert(file_name);
    return r_.read_f32(t);
  }

  void mark_used(const std::string& file_name) { used_.insert(file_name); }
  bool used(const std::string& file_name) const { return used_.count(file_name) != 0; }

 private:
  safetensors::Reader r_;
  std::set<std::string> used_;
};

// (transformer.)h.<digits>.attn.(bias|masked_bias): GPT-2's causal-mask buffers.
bool is_attention_buffer(std::string_view n) {
  if (n.starts_with("transformer.")) n.remove_prefix(12);
  if (!n.starts_with("h.")) return false;
  n.remove_prefix(2);
  size_t digits = 0;
  while (digits < n.size() && n[digits] >= '0' && n[digits] <= '9') ++digits;
  if (digits == 0) return false;
  n.remove_prefix(digits);
  return n == ".attn.bias" || n == ".attn.masked_bias";
}

// HF Conv1D weight [in, out] -> Megatron linear weight [out, in].
std::vector<float> transpose(const std::vector<float>& w, int64_t in, int64_t out) {
  std::vector<float> r(w.size());
  for (int64_t i = 0; i < in; ++i)
    for (int64_t o = 0; o < out; ++o) r[o * in + i] = w[i * out + o];
  return r;
}

// Megatron's linear_qkv row for HF c_attn output column `col` (megatron/core/transformer/
// attention.py's SelfAttention, no GQA):
// HF orders columns [Q heads; K heads; V heads], Megatron rows [q_h; k_h; v_h] per head.
int64_t qkv_row(int64_t col, int64_t heads, int64_t hd) {
  const int64_t width = heads * hd;
  const int64_t part = col / width, head = (col % width) / hd, d = col % hd;
  return head * 3 * hd + part * hd + d;
}

// The [vocab, H] HF matrix in the first rows of a zero [padded, H] one.
std::vector<float> pad_rows(const std::vector<float>& w, int64_t padded, int64_t h) {
  std::vector<float> r(static_cast<size_t>(padded * h), 0.0f);
  std::copy(w.begin(), w.end(), r.begin());
  return r;
}

}  // namespace

std::map<std::string, std::vector<float>> load_hf_gpt2(const std::string& dir, const GPTConfig& config) {
  const std::string config_path = dir + "/config.json";
  const std::string model_path = dir + "/model.safetensors";
  if (!file_exists(config_path) && !file_exists(model_path))
    throw usage_error("--init-from-hf " + dir + ": no config.json or model.safetensors there",
                      "pass a Hugging Face GPT-2 folder (config.json + model.safetensors)");
  const HFConfig hf = parse_hf_config(read_config_json(config_path), config_path);
  check_config(hf, config, config_path);
  if (!file_exists(model_path)) {
    std::string hint = "save the model with safe_serialization=True";
    if (file_exists(dir + "/model.safetensors.index.json"))
      hint = "sharded checkpoints are not supported yet; merge the shards into model.safetensors";
    else if (file_exists(dir + "/pytorch_model.bin"))
      hint = "pytorch_model.bin (pickle) is never loaded; convert it to model.safetensors";
    throw usage_error(model_path + ": not found", hint);
  }
  HFTensors f(safetensors::Reader::open(model_path));

  const int64_t H = config.hidden_size, F = config.ffn_hidden_size, heads = config.num_attention_heads,
                hd = config.kv_channels, A = heads * hd, V = hf.vocab_size, Vp = config.padded_vocab_size,
                P = config.max_position_embeddings;
  std::map<std::string, std::vector<float>> out;

  std::vector<float> wte = f.get("wte.weight", {V, H}, "embedding.word_embeddings.weight");
  out["embedding.word_embeddings.weight"] = pad_rows(wte, Vp, H);
  out["embedding.position_embeddings.weight"] = f.get("wpe.weight", {P, H}, "embedding.position_embeddings.weight");

  for (int l = 0; l < config.num_layers; ++l) {
    const std::string hp = "h." + std::to_string(l) + ".";
    const std::string mp = "decoder.layers." + std::to_string(l) + ".";
    auto vec = [&](const std::string& hname, int64_t n, const std::string& mname) {
      out[mp + mname] = f.get(hp + hname, {n}, mp + mname);
    };
    auto conv1d = [&](const std::string& hname, int64_t in, int64_t o, const std::string& mname) {
      out[mp + mname] = transpose(f.get(hp + hname, {in, o}, mp + mname), in, o);
    };
    vec("ln_1.weight", H, "input_layernorm.weight");
    vec("ln_1.bias", H, "input_layernorm.bias");

    const std::string qkv_w = mp + "self_attention.linear_qkv.weight";
    const std::string qkv_b = mp + "self_attention.linear_qkv.bias";
    std::vector<float> cw = f.get(hp + "attn.c_attn.weight", {H, 3 * A}, qkv_w);
    std::vector<float> cb = f.get(hp + "attn.c_attn.bias", {3 * A}, qkv_b);
    std::vector<float> w(cw.size()), b(cb.size());
    for (int64_t col = 0; col < 3 * A; ++col) {
      const int64_t row = qkv_row(col, heads, hd);
      b[row] = cb[col];
      for (int64_t j = 0; j < H; ++j) w[row * H + j] = cw[j * 3 * A + col];
    }
    out[qkv_w] = std::move(w);
    out[qkv_b] = std::move(b);

    conv1d("attn.c_proj.weight", A, H, "self_attention.linear_proj.weight");
    vec("attn.c_proj.bias", H, "self_attention.linear_proj.bias");
    vec("ln_2.weight", H, "pre_mlp_layernorm.weight");
    vec("ln_2.bias", H, "pre_mlp_layernorm.bias");
    conv1d("mlp.c_fc.weight", H, F, "mlp.linear_fc1.weight");
    vec("mlp.c_fc.bias", F, "mlp.linear_fc1.bias");
    conv1d("mlp.c_proj.weight", F, H, "mlp.linear_fc2.weight");
    vec("mlp.c_proj.bias", H, "mlp.linear_fc2.bias");
  }
  out["decoder.final_layernorm.weight"] = f.get("ln_f.weight", {H}, "decoder.final_layernorm.weight");
  out["decoder.final_layernorm.bias"] = f.get("ln_f.bias", {H}, "decoder.final_layernorm.bias");

  // lm_head is never under `transformer.`.
  const bool has_lm_head = f.reader().contains("lm_head.weight");
  if (config.untie_embeddings_and_output_weights) {
    if (!has_lm_head)
      throw runtime_error(model_path + ": missing tensor lm_head.weight, expected shape " +
                              shape_str({V, H}) + " for output_layer.weight "
                              "(--untie-embeddings-and-output-weights)",
                          "this model ties lm_head to wte; drop --untie-embeddings-and-output-weights");
    std::vector<float> lm = f.get("lm_head.weight", {V, H}, "output_layer.weight");
    out["output_layer.weight"] = pad_rows(lm, Vp, H);
  } else if (has_lm_head) {
    // Tied: a stored lm_head must be the embedding itself.
    std::vector<float> lm = f.get("lm_head.weight", {V, H}, "output_layer.weight (tied to the embedding)");
    if (lm != wte)
      throw usage_error(model_path + ": lm_head.weight differs from wte but the output layer is tied "
                        "to the embedding",
                        "pass --untie-embeddings-and-output-weights");
  }

  // Everything else must be a causal-mask buffer; anything unknown means a different model.
  for (const auto& t : f.reader().tensors()) {
    if (f.used(t.name) || is_attention_buffer(t.name)) continue;
    throw runtime_error(model_path + ": unexpected tensor " + t.name + " " + shape_str(t.shape) +
                            " for a GPT2LMHeadModel with " + std::to_string(config.num_layers) + " layers",
                        "is this a GPT-2 checkpoint matching config.json and --num-layers?");
  }

  // The result must be exactly the model's parameter list.
  std::vector<ParamSpec> specs = gpt_param_specs(config);
  for (const ParamSpec& s : specs) {
    auto it = out.find(s.name);
    if (it == out.end())
      throw usage_error("--init-from-hf: a GPT-2 checkpoint has no tensor for " + s.name + " " +
                        shape_str(s.shape),
                        "the flags describe a model GPT-2 cannot initialise");
    int64_t n = 1;
    for (int64_t d : s.shape) n *= d;
    TESSERA_CHECK(static_cast<int64_t>(it->second.size()) == n,
                  s.name + ": converted " + std::to_string(it->second.size()) + " values for shape " +
                      shape_str(s.shape));
  }
  TESSERA_CHECK(out.size() == specs.size(), "load_hf_gpt2 produced tensors the model does not have");
  return out;
}

}  // namespace tessera
