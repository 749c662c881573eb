// The Llama family's Hugging Face folders (LlamaForCausalLM; Qwen2ForCausalLM, which adds
// q/k/v biases) in both directions, with Megatron's names and layouts
// (tools/checkpoint/loader_llama_mistral.py and saver_mcore.py; megatron/core/transformer/
// attention.py and mlp.py):
//   - q_proj, k_proj, v_proj ([NH*hd, H], [NG*hd, H], [NG*hd, H]) become linear_qkv's grouped
//     rows: per query group g, the q rows of its NH/NG heads, then k_g, then v_g (biases alike);
//   - gate_proj and up_proj become linear_fc1 [2, F, H] ([0] gate, [1] up; biases [2, F]);
//   - o_proj, down_proj, the norms and the embeddings keep their layout ([out, in] on both
//     sides; RoPE's q/k channel order is the same: no permutation);
//   - the vocabulary pads with zero rows, as the GPT-2 path does: a zero output row gives the
//     padding tokens logit 0 whatever the last real token is (Megatron's converter copies the
//     last row instead), and an export drops the rows again losslessly;
//   - tie_word_embeddings true with untied flags copies the embedding into output_layer (the
//     run then trains them apart, as Megatron's converter always writes untied models);
//   - rotary_emb.inv_freq buffers of older files are ignored (RoPE has no parameters).
//   - RoPE in either config layout (hf_rope.h): rope_type llama3 is --use-rope-scaling;
//     exports write both layouts.
// config.json must agree with the flags; one error names every difference with its field and
// flag (GQA's key/value heads need --group-query-attention besides --num-query-groups). Not
// expressible, each an error naming the field: rope types other than default and llama3,
// hidden_act other than silu, Qwen2's sliding window (use_sliding_window, or layer_types other
// than full_attention), an o_proj bias without MLP biases (Megatron's --add-bias-linear is all
// four linears or none).
#pragma once

#include <map>
#include <string>
#include <vector>

#include "tessera/ckpt/hf_files.h"
#include "tessera/model/gpt_config.h"

namespace tessera {

// Every parameter of gpt_param_specs(config), keyed by its Megatron name, full shapes, from the
// LlamaForCausalLM or Qwen2ForCausalLM folder `dir`.
std::map<std::string, std::vector<float>> load_hf_llama(const std::string& dir, const GPTConfig& config);

// True when `c` is a Llama-family model (RMSNorm, RoPE or SwiGLU): it exports as Llama or Qwen2.
bool is_llama_family(const GPTConfig& c);
// Throws a usage error naming the flag when neither LlamaForCausalLM nor Qwen2ForCausalLM can
// express `c`. Qwen2 when linear_qkv alone has biases (--disable-bias-linear --add-qkv-bias).
HFFamily check_llama_expressible(const GPTConfig& c);

// LlamaConfig's or Qwen2Config's fields for `spec` (config.json).
nlohmann::json llama_config_json(const HFExportSpec& spec);

// Megatron-layout weights (gpt_param_specs(c), full shapes) as the HF state dict, in its order.
std::vector<HFTensor> megatron_to_hf_llama(const std::map<std::string, std::vector<float>>& weights,
                                           const GPTConfig& c);

// `tessera train` model flags for the Llama or Qwen2 of `cfg`.
std::vector<std::string> llama_train_flags(const HFConfigFile& cfg);

}  // namespace tessera
