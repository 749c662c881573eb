// GPTConfig: the shape of Megatron's GPT (`pretrain_gpt`, --transformer-impl local) and
// the list of its parameters, named as Megatron's state dict names them
// (megatron/core/models/gpt/gpt_model.py and the layer specs it builds).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "tessera/core/tensor.h"
#include "tessera/model/moe_config.h"
#include "tessera/ops/ops.h"

namespace tessera {

// Activation recomputation (Megatron's --recompute-*): what backward recomputes instead of
// keeping from forward.
enum class Recompute { None, Selective, Full };
enum class RecomputeMethod { Uniform, Block };
// Megatron's --normalization and --position-embedding-type.
enum class Normalization { LayerNorm, RMSNorm };
enum class PositionEmbedding { LearnedAbsolute, Rope, None };

struct GPTConfig {
  int num_layers = 0;
  int hidden_size = 0;
  int num_attention_heads = 0;
  int kv_channels = 0;       // head dim; hidden_size / heads by default
  int ffn_hidden_size = 0;   // 4 * hidden_size by default
  int seq_length = 0;
  int max_position_embeddings = 0;
  int vocab_size = 0;         // the tokenizer's
  int padded_vocab_size = 0;  // rows of the embedding and output matrices
  float norm_epsilon = 1e-5f;
  float init_method_std = 0.02f;
  float hidden_dropout = 0.1f;
  float attention_dropout = 0.1f;
  ops::GeluKind gelu = ops::GeluKind::Tanh;
  // Parameters and activations (Megatron's Float16Module with --bf16 / --fp16): F32, BF16 or
  // F16. Gradients of parameters stay f32 (the optimizer keeps f32 main parameters), and so
  // do the statistics Megatron computes in f32 (norms, softmax, the loss).
  DType params_dtype = DType::F32;
  bool untie_embeddings_and_output_weights = false;
  bool add_bias_linear = true;  // biases of linear_qkv, linear_proj, fc1, fc2
  bool add_qkv_bias = false;    // linear_qkv's bias even without the others (Qwen2's --add-qkv-bias)
  // The Llama family (Megatron's --normalization RMSNorm, --position-embedding-type rope,
  // --swiglu, --group-query-attention --num-query-groups).
  Normalization normalization = Normalization::LayerNorm;
  PositionEmbedding position_embedding = PositionEmbedding::LearnedAbsolute;
  float rotary_base = 10000.0f;
  float rotary_percent = 1.0f;
  // Llama 3.1's scaling of the rotary frequencies (--use-rope-scaling, --rope-scaling-factor:
  // Llama 3.1 8, Llama 3.2 32), with Megatron's low/high frequency factors 1 and 4 and
  // original context 8192 (ops.h RopeScaling's defaults).
  bool use_rope_scaling = false;
  float rope_scaling_factor = 8.0f;
  // fc1 produces [gate | up] (2 * ffn_hidden_size) and silu(gate) * up feeds fc2.
  bool swiglu = false;
  int num_query_groups = 0;  // key/value heads; num_attention_heads without GQA
  uint32_t seed = 1234;
  // None; Selective: the attention core (probabilities) of every layer; Full: whole layers,
  // keeping only their inputs — Uniform: groups of recompute_num_layers layers, Block: the
  // first recompute_num_layers layers of each chunk, one by one.
  Recompute recompute = Recompute::None;
  RecomputeMethod recompute_method = RecomputeMethod::Uniform;
  int recompute_num_layers = 1;
  // Mixture of experts (model/moe_config.h): its layers' MLP is a router and experts.
  MoEConfig moe;

  int attention_width() const { return num_attention_heads * kv_channels; }
  int query_groups() const { return num_query_groups > 0 ? num_query_groups : num_attention_heads; }
  // Rows of linear_qkv: the queries, plus one key and one value per query group.
  int64_t qkv_width() const { return int64_t{num_attention_heads + 2 * query_groups()} * kv_channels; }
  bool has_qkv_bias() const { return add_bias_linear || add_qkv_bias; }
  bool has_layernorm_bias() const { return normalization == Normalization::LayerNorm; }
  // Channels of each query/key head that RoPE rotates (Megatron: hn, or int(hn * percent)).
  int rotary_dim() const;
  // RoPE as the attention_qkv ops take it (dim 0 without rotary position embedding).
  ops::Rope rope() const;
  // The model has an attention_qkv step (RoPE, query groups) between the QKV projection and attention.
  bool regroups_qkv() const { return rotary_dim() > 0 || query_groups() != num_attention_heads; }
};

// How a parameter starts (Megatron's init_method and output_layer_init_method in
// megatron/core/transformer/transformer_config.py).
enum class ParamInit { Normal, ScaledNormal, Zeros, Ones };

struct ParamSpec {
  std::string name;   // Megatron state-dict name, e.g. "decoder.layers.0.mlp.linear_fc1.weight"
  Shape shape;        // the full (unsharded) shape
  ParamInit init;
  bool weight_decay;  // false for biases and 1-D parameters (megatron/core/optimizer/__init__.py)
  uint32_t id;        // stable index, keys the counter-based init RNG
};

// Vocabulary padded to a multiple of divisible_by * tp (_vocab_size_with_padding in
// megatron/training/tokenizer/tokenizer.py).
int padded_vocab_size(int vocab_size, int divisible_by, int tp_size);

// All parameters of the model in Megatron's registration order. The word embedding doubles
// as the output layer unless untie_embeddings_and_output_weights. An MoE layer's MLP is
// Megatron's MoELayer with SequentialMLP experts: mlp.router.weight [E, H], then per expert
// mlp.experts.local_experts.X.linear_fc1/linear_fc2 (the MLP's shapes with
// moe.ffn_hidden_size), then mlp.shared_experts.linear_fc1/linear_fc2 (and gate_weight
// [1, H]) with shared experts. Full shapes, independent
// of the parallel layout: with --swiglu linear_fc1's weight is [2, F, H] (its bias [2, F]):
// the gate's rows, then the up projection's, which Megatron's torch_dist format also stores
// as one [W_gate; W_up]; a tensor-parallel rank holds [gate_r; up_r], a slice of dim 1.
std::vector<ParamSpec> gpt_param_specs(const GPTConfig& c);

}  // namespace tessera
