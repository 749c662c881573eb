// Which of megatron-core's GPT layer specs a Megatron file tessera writes follows, decided in one
// place from the saved Namespace's transformer_impl (megatron/core/models/gpt/gpt_layer_specs.py,
// core_r0.10.0, as pretrain_gpt.py picks it):
//
//   - 'local' (get_gpt_layer_local_spec): tessera's own names and order. Each layer registers
//     input_layernorm, self_attention.linear_proj, self_attention.linear_qkv, pre_mlp_layernorm,
//     mlp; every linear layer ends with its `_extra_state` None (megatron/core/tensor_parallel/
//     layers.py).
//   - 'transformer_engine' (get_gpt_layer_with_transformer_engine_spec, Megatron's default):
//     the norms before attention and before a dense MLP are fused into the next linear layer
//     (Transformer Engine's LayerNormLinear), so a layer registers self_attention.linear_proj,
//     then linear_qkv.layer_norm_weight/_bias, linear_qkv.weight/bias, then
//     mlp.linear_fc1.layer_norm_weight/_bias, linear_fc1, linear_fc2 (an MoE layer keeps its
//     pre_mlp_layernorm, a TENorm, before its mlp). This order is the optimizer's parameter order
//     too. Transformer Engine's modules carry extra state: its linear layers and
//     self_attention.core_attention (DotProductAttention) an io.BytesIO holding torch.save(None)
//     (transformer_engine/pytorch/module/base.py get_extra_state, TE 1.13 without fp8), its norms
//     (decoder.final_layernorm, an MoE layer's pre_mlp_layernorm: TE's ops-based LayerNorm /
//     RMSNorm) an empty tensor (transformer_engine/pytorch/ops/op.py). megatron-core's own
//     modules keep theirs: output_layer and SequentialMLP's expert linears None.
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "tessera/ckpt/megatron_checkpoint.h"
#include "tessera/ckpt/pickle.h"

namespace tessera {

// Whether the Namespace `args` (megatron_checkpoint.h's JSON) names Transformer Engine's spec.
bool megatron_uses_transformer_engine(const nlohmann::json& args);

// A file's parameters (tessera's = the local spec's names and order, each chunk's layers
// numbered from 0) in the registration order of the spec `args` names, under its names.
std::vector<MegatronParam> megatron_spec_params(const nlohmann::json& args, const std::vector<MegatronParam>& params);

// What a module's `_extra_state` holds.
enum class MegatronExtraState {
  None,                       // megatron-core's modules
  TransformerEngineModule,    // io.BytesIO of torch.save(None)
  TransformerEngineNorm,      // torch.Tensor(): an empty float32 tensor
};

namespace megatron {
class FileTensors;
}
// The value of an extra state, in `doc` (a tensor's storage in `tensors`).
pickle::Value* megatron_extra_state_value(pickle::Document& doc, megatron::FileTensors& tensors,
                                          MegatronExtraState extra);

// One entry of a model chunk's state dict: parameter `param` (an index into the names given),
// or, when param < 0, `key`'s extra state.
struct MegatronModelEntry {
  int param = -1;
  std::string key;
  MegatronExtraState extra = MegatronExtraState::None;
};

// A chunk's state dict entries for its parameter names (megatron_spec_params' order): each
// module's parameters, then its _extra_state where the spec's module has one; the output
// layer's `_extra_state` last when with_output_layer (the last stage's last chunk).
std::vector<MegatronModelEntry> megatron_model_entries(bool transformer_engine, const std::vector<std::string>& names,
                                                      bool with_output_layer);

// torch_dist: the modules whose `_extra_state` a rank's sharded state dict holds (a ShardedObject
// each), for tessera's global parameter names of the rank: (a parameter-like name of the module,
// "<module>.weight", whose torch_dist key gives the object's, and what it holds).
std::vector<std::pair<std::string, MegatronExtraState>> torch_dist_extra_states(
    bool transformer_engine, const std::vector<std::string>& names);

}  // namespace tessera
