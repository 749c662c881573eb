// Hugging Face GPT-2 export (`tessera ckpt export-hf`) and the helpers of `tessera ckpt
// import-hf`: the inverse of hf_gpt2.h's conversion:
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

#include "tessera/core/tensor.h"
#include "tessera/model/gpt_config.h"

namespace tessera {

struct HFExportSpec {
  GPTConfig model;
  int64_t bos_token_id = -1;  // -1: not written
  int64_t eos_token_id = -1;
  std::string vocab_file;  // copied to OUT/vocab.json when not empty (GPT-2 BPE)
  std::string merge_file;  // copied to OUT/merges.txt when not empty
};

struct HFTensor {
  std::string name;
  Shape shape;
  std::vector<float> data;
};

// Throws a usage error naming the flag when GPT-2 (GPT2LMHeadModel) cannot express `c`.
void check_gpt2_expressible(const GPTConfig& c);

// GPT2Config's fields for `spec` (config.json).
nlohmann::json gpt2_config_json(const HFExportSpec& spec);

// Megatron-layout weights (every parameter of gpt_param_specs(c), full shapes) as
// GPT2LMHeadModel tensors, in the state dict's order.
std::vector<HFTensor> megatron_to_hf_gpt2(const std::map<std::string, std::vector<float>>& weights,
                                          const GPTConfig& c);

// Writes OUT/config.json, OUT/model.safetensors (atomically) and the tokenizer files.
void write_hf_gpt2(const std::string& out_dir, const HFExportSpec& spec,
                   const std::map<std::string, std::vector<float>>& weights);

// The full model tensors of checkpoint `iteration` in `dir`, assembled from whatever (TP, PP)
// layout saved it; the checksum of every file read and every tensor's name and global shape
// verified against `c` (checkpoint.h's load_checkpoint).
std::map<std::string, std::vector<float>> read_checkpoint_model(const std::string& dir, int64_t iteration,
                                                                const GPTConfig& c);

// `tessera train` flags that describe the GPT-2 of HF_DIR/config.json (model shape, GELU,
// epsilon, tying; GPT2BPETokenizer with HF_DIR's vocab.json/merges.txt when both exist, else
// NullTokenizer with vocab_size - 1 so that the vocabulary is vocab_size).
std::vector<std::string> train_flags_from_hf_config(const std::string& hf_dir);

}  // namespace tessera
