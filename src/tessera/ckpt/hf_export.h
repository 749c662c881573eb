// Hugging Face interop's entry points, which pick the family (hf_llama.h for RMSNorm/RoPE/SwiGLU
// models, GPT-2 otherwise): --init-from-hf and `tessera ckpt import-hf` (load_hf_model,
// train_flags_from_hf_config) and `tessera ckpt export-hf` (write_hf_model). GPT-2's export,
// the inverse of hf_gpt2.h's conversion:
//   - Megatron linear weights [out, in] become HF Conv1D weights [in, out];
//   - linear_qkv's per-head rows [q_h; k_h; v_h] become c_attn's columns [all Q; all K; all V]
//     (weight and bias);
//   - the padded vocabulary rows are dropped: wte (and lm_head when untied) keep the
//     tokenizer's vocab_size rows;
//   - a tied output layer is expressed by tie_word_embeddings true and no lm_head.weight (as
//     save_pretrained writes it); an untied one by lm_head.weight and tie_word_embeddings false.
// Tensors are named transformer.* (GPT2LMHeadModel's state dict), F32. A model GPT-2's format
// cannot express is a usage error naming the flag.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "tessera/ckpt/hf_files.h"
#include "tessera/core/tensor.h"
#include "tessera/model/gpt_config.h"

namespace tessera {

// Throws a usage error naming the flag when GPT-2 (GPT2LMHeadModel) cannot express `c`.
void check_gpt2_expressible(const GPTConfig& c);

// GPT2Config's fields for `spec` (config.json).
nlohmann::json gpt2_config_json(const HFExportSpec& spec);

// Megatron-layout weights (every parameter of gpt_param_specs(c), full shapes) as
// GPT2LMHeadModel tensors, in the state dict's order.
std::vector<HFTensor> megatron_to_hf_gpt2(const std::map<std::string, std::vector<float>>& weights,
                                          const GPTConfig& c);

// Every parameter of gpt_param_specs(c), keyed by its Megatron name, full shapes, from the
// Hugging Face folder `dir` of whichever family its config.json declares.
std::map<std::string, std::vector<float>> load_hf_model(const std::string& dir, const GPTConfig& c);

// Throws a usage error naming the flag when no Hugging Face family tessera writes can express `c`.
void check_hf_expressible(const GPTConfig& c);

// Writes OUT/config.json, OUT/model.safetensors (atomically) and the tokenizer files, as GPT-2,
// Llama or Qwen2 as `spec.model` is.
void write_hf_model(const std::string& out_dir, const HFExportSpec& spec,
                   const std::map<std::string, std::vector<float>>& weights);

// The full model tensors of checkpoint `iteration` in `dir`, assembled from whatever (TP, PP)
// layout saved it; the checksum of every file read and every tensor's name and global shape
// verified against `c` (checkpoint.h's load_checkpoint).
std::map<std::string, std::vector<float>> read_checkpoint_model(const std::string& dir, int64_t iteration,
                                                                const GPTConfig& c);

// `tessera train` flags that describe the model of HF_DIR/config.json. GPT-2: model shape, GELU,
// epsilon, tying; GPT2BPETokenizer with HF_DIR's vocab.json/merges.txt when both exist. Llama
// and Qwen2: hf_llama.h's llama_train_flags. Otherwise NullTokenizer with vocab_size - 1 so
// that the vocabulary is vocab_size.
std::vector<std::string> train_flags_from_hf_config(const std::string& hf_dir);

}  // namespace tessera
