// The mixture-of-experts MLPs of Hugging Face's MixtralForCausalLM and Qwen2MoeForCausalLM in
// both directions, with Megatron's MoE names (megatron/core/transformer/moe/: SequentialMLP
// experts, TopKRouter, SharedExpertMLP with its gate; tools/checkpoint/loader_mixtral_hf.py):
//   - Mixtral: block_sparse_moe.gate [E, H] is mlp.router.weight; expert X's w1 (gate) and w3
//     (up) become local_experts.X.linear_fc1 [2, F, H], w2 (down) its linear_fc2. Routing:
//     softmax over the top-k logits (Megatron's default, not --moe-router-pre-softmax).
//   - Qwen2-MoE: mlp.gate is the router; experts' gate_proj/up_proj/down_proj as Llama's MLP;
//     mlp.shared_expert.* the shared experts (--moe-shared-expert-intermediate-size) and
//     mlp.shared_expert_gate [1, H] their sigmoid gate (--moe-shared-expert-gate). Routing: the
//     top-k of the softmax (--moe-router-pre-softmax) unless norm_topk_prob renormalises it,
//     which is the softmax over the top-k logits; dense layers (mlp_only_layers,
//     decoder_sparse_step) are --moe-layer-freq's list, their intermediate_size
//     --ffn-hidden-size.
// The rest of both models is Llama's (Mixtral) and Qwen2's (Qwen2-MoE): hf_llama.h.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "tessera/ckpt/hf_files.h"
#include "tessera/model/gpt_config.h"

namespace tessera {

bool is_hf_moe_family(HFFamily f);

// What config.json says about the experts (MixtralConfig's / Qwen2MoeConfig's defaults).
struct HFMoEShape {
  int64_t experts = 0, topk = 0, ffn = 0, shared_ffn = 0;
  bool pre_softmax = false;
  std::vector<bool> moe_layers;
};
HFMoEShape parse_hf_moe(const HFConfigFile& cfg, HFFamily family, int64_t layers);

// The experts of config.json against the flags' (each difference names the field and flag).
void check_hf_moe(HFFlagCheck& check, const HFMoEShape& h, HFFamily family, const GPTConfig& c);

// Layer l's MLP (Megatron names under `mp`, HF's under `hp`): reads into `out`.
void load_hf_moe_mlp(std::map<std::string, std::vector<float>>& out, HFWeights& f, HFFamily family,
                     const std::string& hp, const std::string& mp, const GPTConfig& c);
// And back, appending HF's tensors of layer l's MLP.
void hf_moe_mlp_tensors(std::vector<HFTensor>& out, const std::map<std::string, std::vector<float>>& w,
                        HFFamily family, const std::string& hp, const std::string& mp, const GPTConfig& c);

// The family an MoE model exports as (Qwen2-MoE with shared experts or linear_qkv biases,
// else Mixtral); throws naming the flag when neither can express it.
HFFamily check_hf_moe_expressible(const GPTConfig& c);
// config.json's MoE fields.
void write_hf_moe_config(nlohmann::json& j, HFFamily family, const GPTConfig& c);
// `tessera train` flags of the experts.
std::vector<std::string> hf_moe_train_flags(const HFMoEShape& h);

}  // namespace tessera
