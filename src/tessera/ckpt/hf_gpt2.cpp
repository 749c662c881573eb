#include "tessera/ckpt/hf_gpt2.h"

#include <string_view>

#include "tessera/ckpt/hf_files.h"
#include "tessera/core/error.h"

namespace tessera {

namespace {

// What config.json says about the model, with GPT2Config's defaults for absent keys.
struct HFConfig {
  int64_t n_layer = 0, n_embd = 0, n_head = 0, n_positions = 0, vocab_size = 0, n_inner = 0;
  std::string activation = "gelu_new";
  double layer_norm_epsilon = 1e-5;
  bool tie_word_embeddings = true;
};

HFConfig parse_hf_config(const HFConfigFile& j) {
  if (j.family() != HFFamily::GPT2)
    j.unsupported("model_type", std::string("a ") + hf_family_name(j.family()) + " model, expected \"gpt2\"",
                  "load_hf_model reads every family tessera converts");
  HFConfig c;
  c.n_layer = j.integer("n_layer");
  c.n_embd = j.integer("n_embd");
  c.n_head = j.integer("n_head");
  c.n_positions = j.integer("n_positions");
  c.vocab_size = j.integer("vocab_size");
  c.n_inner = j.integer("n_inner", 4 * c.n_embd);
  c.activation = j.string("activation_function", c.activation);
  c.layer_norm_epsilon = j.number("layer_norm_epsilon", c.layer_norm_epsilon);
  c.tie_word_embeddings = j.boolean("tie_word_embeddings", true);
  // Variants GPT2Config allows that Megatron's GPT cannot express.
  if (!j.boolean("scale_attn_weights", true))
    j.unsupported("scale_attn_weights", "but Megatron's attention always scales by 1/sqrt(head dim)", "");
  if (j.boolean("scale_attn_by_inverse_layer_idx", false))
    j.unsupported("scale_attn_by_inverse_layer_idx", "but Megatron's GPT has no such scaling", "");
  if (j.boolean("add_cross_attention", false))
    j.unsupported("add_cross_attention", "but Megatron's GPT is decoder-only", "");
  return c;
}

void check_config(const HFConfig& h, const GPTConfig& c, const HFConfigFile& j) {
  if (h.n_embd % h.n_head != 0)
    throw runtime_error(j.path() + ": n_embd " + std::to_string(h.n_embd) + " is not divisible by n_head " +
                        std::to_string(h.n_head));
  HFFlagCheck check(j);
  if (c.normalization != Normalization::LayerNorm || c.position_embedding != PositionEmbedding::LearnedAbsolute ||
      c.swiglu || c.query_groups() != c.num_attention_heads)
    check.differ("a GPT-2 model, but the flags describe a Llama-style one (--normalization, "
                 "--position-embedding-type, --swiglu or --num-query-groups)",
                 "drop the Llama flags to start from GPT-2 weights");
  check.equal("n_layer", h.n_layer, "--num-layers", c.num_layers);
  check.equal("n_embd", h.n_embd, "--hidden-size", c.hidden_size);
  check.equal("n_head", h.n_head, "--num-attention-heads", c.num_attention_heads);
  check.equal("n_embd / n_head", h.n_embd / h.n_head, "--kv-channels", c.kv_channels);
  check.equal("n_inner", h.n_inner, "--ffn-hidden-size", c.ffn_hidden_size);
  // HF's wpe has n_positions rows; Megatron's position table has --max-position-embeddings.
  check.equal("n_positions", h.n_positions, "--max-position-embeddings", c.max_position_embeddings);
  check_vocab_fits(check, j, h.vocab_size, c);

  ops::GeluKind hf_gelu;
  if (h.activation == "gelu_new" || h.activation == "gelu_pytorch_tanh" || h.activation == "gelu_fast")
    hf_gelu = ops::GeluKind::Tanh;
  else if (h.activation == "gelu")
    hf_gelu = ops::GeluKind::Erf;
  else
    throw usage_error(j.path() + ": activation_function \"" + h.activation + "\" is not supported",
                      "Megatron's GPT uses GELU: gelu_new (tanh) or gelu (erf)");
  if (hf_gelu != c.gelu) {
    if (hf_gelu == ops::GeluKind::Tanh)
      check.differ("activation_function \"" + h.activation +
                       "\" is the tanh GELU but --no-bias-gelu-fusion selects the erf GELU",
                   "drop --no-bias-gelu-fusion (or pass --openai-gelu)");
    else
      check.differ("activation_function \"gelu\" is the erf GELU but the flags select the tanh GELU (bias-GELU "
                   "fusion or --openai-gelu)",
                   "pass --no-bias-gelu-fusion and drop --openai-gelu");
  }
  check.close("layer_norm_epsilon", h.layer_norm_epsilon, "--norm-epsilon", c.norm_epsilon);
  if (!c.add_bias_linear)
    check.differ("GPT-2 has biases in every linear layer but --disable-bias-linear removes them",
                 "drop --disable-bias-linear");
  if (!h.tie_word_embeddings && !c.untie_embeddings_and_output_weights)
    check.differ("tie_word_embeddings is false (lm_head differs from wte) but the output layer is tied to the "
                 "embedding",
                 "pass --untie-embeddings-and-output-weights");
  check.done();
}

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

}  // namespace

std::map<std::string, std::vector<float>> load_hf_gpt2(const std::string& dir, const GPTConfig& config) {
  const HFConfigFile j = HFConfigFile::read(dir);
  const HFConfig hf = parse_hf_config(j);
  check_config(hf, config, j);
  HFWeights f = HFWeights::open(dir, "transformer.");

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
  const bool has_lm_head = f.contains("lm_head.weight");
  if (config.untie_embeddings_and_output_weights) {
    if (!has_lm_head)
      throw runtime_error(dir + "/model.safetensors: missing tensor lm_head.weight, expected shape " +
                              shape_str({V, H}) + " for output_layer.weight "
                              "(--untie-embeddings-and-output-weights)",
                          "this model ties lm_head to wte; drop --untie-embeddings-and-output-weights");
    std::vector<float> lm = f.get("lm_head.weight", {V, H}, "output_layer.weight");
    out["output_layer.weight"] = pad_rows(lm, Vp, H);
  } else if (has_lm_head) {
    // Tied: a stored lm_head must be the embedding itself.
    std::vector<float> lm = f.get("lm_head.weight", {V, H}, "output_layer.weight (tied to the embedding)");
    if (lm != wte)
      throw usage_error(dir + "/model.safetensors: lm_head.weight differs from wte but the output layer is tied "
                        "to the embedding",
                        "pass --untie-embeddings-and-output-weights");
  }

  // Everything else must be a causal-mask buffer; anything unknown means a different model.
  f.check_all_read(is_attention_buffer,
                   "a GPT2LMHeadModel with " + std::to_string(config.num_layers) + " layers");
  check_param_list(out, config, "GPT-2");
  return out;
}

}  // namespace tessera
