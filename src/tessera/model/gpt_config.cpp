#include "tessera/model/gpt_config.h"

namespace tessera {

int padded_vocab_size(int vocab_size, int divisible_by, int tp_size) {
  int multiple = divisible_by * tp_size;
  return (vocab_size + multiple - 1) / multiple * multiple;
}

int GPTConfig::rotary_dim() const {
  if (position_embedding != PositionEmbedding::Rope) return 0;
  return rotary_percent >= 1.0f ? kv_channels : static_cast<int>(kv_channels * rotary_percent);
}

ops::Rope GPTConfig::rope() const {
  ops::Rope r{rotary_dim(), rotary_base, {}};
  if (use_rope_scaling) r.scaling.factor = rope_scaling_factor;
  return r;
}

std::vector<ParamSpec> gpt_param_specs(const GPTConfig& c) {
  std::vector<ParamSpec> specs;
  auto add = [&](std::string name, Shape shape, ParamInit init) {
    bool decay = shape.size() > 1 && !name.ends_with(".bias");
    specs.push_back({std::move(name), std::move(shape), init, decay, static_cast<uint32_t>(specs.size())});
  };
  const int64_t H = c.hidden_size, A = c.attention_width(), F = c.ffn_hidden_size, QKV = c.qkv_width();
  const bool norm_bias = c.has_layernorm_bias();
  const Shape fc1_weight = c.swiglu ? Shape{2, F, H} : Shape{F, H};
  const Shape fc1_bias = c.swiglu ? Shape{2, F} : Shape{F};
  // Megatron's MoELayer registers its router, its experts, then its shared experts; experts
  // have no biases (the parser refuses --num-experts without --disable-bias-linear).
  auto add_mlp = [&](const std::string& p, int64_t width) {
    add(p + "linear_fc1.weight", c.swiglu ? Shape{2, width, H} : Shape{width, H}, ParamInit::Normal);
    add(p + "linear_fc2.weight", {H, width}, ParamInit::ScaledNormal);
  };
  auto add_moe_mlp = [&](const std::string& p) {
    add(p + "router.weight", {c.moe.num_experts, H}, ParamInit::Normal);
    for (int e = 0; e < c.moe.num_experts; ++e)
      add_mlp(p + "experts.local_experts." + std::to_string(e) + ".", c.moe.ffn_hidden_size);
    if (c.moe.shared_expert_size > 0) {
      add_mlp(p + "shared_experts.", c.moe.shared_expert_size);
      if (c.moe.shared_expert_gate) add(p + "shared_experts.gate_weight", {1, H}, ParamInit::Normal);
    }
  };
  add("embedding.word_embeddings.weight", {c.padded_vocab_size, H}, ParamInit::Normal);
  if (c.position_embedding == PositionEmbedding::LearnedAbsolute)
    add("embedding.position_embeddings.weight", {c.max_position_embeddings, H}, ParamInit::Normal);
  for (int l = 0; l < c.num_layers; ++l) {
    std::string p = "decoder.layers." + std::to_string(l) + ".";
    add(p + "input_layernorm.weight", {H}, ParamInit::Ones);
    if (norm_bias) add(p + "input_layernorm.bias", {H}, ParamInit::Zeros);
    add(p + "self_attention.linear_proj.weight", {H, A}, ParamInit::ScaledNormal);
    if (c.add_bias_linear) add(p + "self_attention.linear_proj.bias", {H}, ParamInit::Zeros);
    add(p + "self_attention.linear_qkv.weight", {QKV, H}, ParamInit::Normal);
    if (c.has_qkv_bias()) add(p + "self_attention.linear_qkv.bias", {QKV}, ParamInit::Zeros);
    add(p + "pre_mlp_layernorm.weight", {H}, ParamInit::Ones);
    if (norm_bias) add(p + "pre_mlp_layernorm.bias", {H}, ParamInit::Zeros);
    if (c.moe.is_moe_layer(l)) {
      add_moe_mlp(p + "mlp.");
      continue;
    }
    add(p + "mlp.linear_fc1.weight", fc1_weight, ParamInit::Normal);
    if (c.add_bias_linear) add(p + "mlp.linear_fc1.bias", fc1_bias, ParamInit::Zeros);
    add(p + "mlp.linear_fc2.weight", {H, F}, ParamInit::ScaledNormal);
    if (c.add_bias_linear) add(p + "mlp.linear_fc2.bias", {H}, ParamInit::Zeros);
  }
  add("decoder.final_layernorm.weight", {H}, ParamInit::Ones);
  if (norm_bias) add("decoder.final_layernorm.bias", {H}, ParamInit::Zeros);
  if (c.untie_embeddings_and_output_weights) add("output_layer.weight", {c.padded_vocab_size, H}, ParamInit::Normal);
  return specs;
}

}  // namespace tessera
