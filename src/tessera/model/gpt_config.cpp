#include "tessera/model/gpt_config.h"

namespace tessera {

int padded_vocab_size(int vocab_size, int divisible_by, int tp_size) {
  int multiple = divisible_by * tp_size;
  return (vocab_size + multiple - 1) / multiple * multiple;
}

std::vector<ParamSpec> gpt_param_specs(const GPTConfig& c) {
  std::vector<ParamSpec> specs;
  auto add = [&](std::string name, Shape shape, ParamInit init) {
    bool decay = shape.size() > 1 && !name.ends_with(".bias");
    specs.push_back({std::move(name), std::move(shape), init, decay, static_cast<uint32_t>(specs.size())});
  };
  const int64_t H = c.hidden_size, A = c.attention_width(), F = c.ffn_hidden_size;
  add("embedding.word_embeddings.weight", {c.padded_vocab_size, H}, ParamInit::Normal);
  add("embedding.position_embeddings.weight", {c.max_position_embeddings, H}, ParamInit::Normal);
  for (int l = 0; l < c.num_layers; ++l) {
    std::string p = "decoder.layers." + std::to_string(l) + ".";
    add(p + "input_layernorm.weight", {H}, ParamInit::Ones);
    add(p + "input_layernorm.bias", {H}, ParamInit::Zeros);
    add(p + "self_attention.linear_proj.weight", {H, A}, ParamInit::ScaledNormal);
    if (c.add_bias_linear) add(p + "self_attention.linear_proj.bias", {H}, ParamInit::Zeros);
    add(p + "self_attention.linear_qkv.weight", {3 * A, H}, ParamInit::Normal);
    if (c.add_bias_linear) add(p + "self_attention.linear_qkv.bias", {3 * A}, ParamInit::Zeros);
    add(p + "pre_mlp_layernorm.weight", {H}, ParamInit::Ones);
    add(p + "pre_mlp_layernorm.bias", {H}, ParamInit::Zeros);
    add(p + "mlp.linear_fc1.weight", {F, H}, ParamInit::Normal);
    if (c.add_bias_linear) add(p + "mlp.linear_fc1.bias", {F}, ParamInit::Zeros);
    add(p + "mlp.linear_fc2.weight", {H, F}, ParamInit::ScaledNormal);
    if (c.add_bias_linear) add(p + "mlp.linear_fc2.bias", {H}, ParamInit::Zeros);
  }
  add("decoder.final_layernorm.weight", {H}, ParamInit::Ones);
  add("decoder.final_layernorm.bias", {H}, ParamInit::Zeros);
  if (c.untie_embeddings_and_output_weights) add("output_layer.weight", {c.padded_vocab_size, H}, ParamInit::Normal);
  return specs;
}

}  // namespace tessera
