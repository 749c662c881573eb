// Initialisation from a Hugging Face GPT-2 folder (`--init-from-hf DIR`; hf_export.h's
// load_hf_model picks the family): DIR/config.json and DIR/model.safetensors (or the shards
// of model.safetensors.index.json, hf_files.h) of a GPT2LMHeadModel (tensor names with or
// without the `transformer.` prefix), converted to Megatron's names and layouts (megatron/core/models/gpt/gpt_model.py,
// megatron/core/transformer/attention.py):
//   - Conv1D weights are [in, out] in HF and become Megatron's [out, in];
//   - c_attn's output columns [all Q; all K; all V] become linear_qkv's per-head rows
//     [q_h; k_h; v_h] (weight and bias);
//   - wte fills the first vocab rows of the [padded_vocab_size, H] embedding, padding rows zero;
//   - attn.bias / attn.masked_bias buffers are ignored; lm_head.weight is optional when the
//     output layer is tied (it must then equal wte) and required when untied, where it becomes
//     output_layer.weight (padded like the embedding);
//   - F32, F16 and BF16 tensors are converted to float.
// config.json must agree with the flags (layers, hidden, heads, ffn, positions, vocab fits the
// padded vocab, GELU flavour, layer-norm epsilon — a different epsilon is an error, not a
// warning, so a run never silently diverges from the model it started from); one error names
// every difference. A tokenizer
// vocabulary that differs from HF's vocab_size is only a warning. A missing, unexpected or
// mismatched tensor is an error naming the tensor and both shapes. Nothing in the files is
// executed.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "tessera/model/gpt_config.h"

namespace tessera {

// Every parameter of gpt_param_specs(config), keyed by its Megatron name, in Megatron's layout
// (row-major, the spec's full unsharded shape).
std::map<std::string, std::vector<float>> load_hf_gpt2(const std::string& dir, const GPTConfig& config);

}  // namespace tessera
