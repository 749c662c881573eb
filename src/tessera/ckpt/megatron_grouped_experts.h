// Megatron's grouped-GEMM experts (--moe-grouped-gemm) in `--ckpt-format torch` files, read
// into and written from SequentialMLP's per-expert names, which tessera's experts carry
// (megatron/core/transformer/moe/experts.py, core_r0.10.0):
//
//   - GroupedMLP (the local spec): a layer's local experts in two parameters,
//       mlp.experts.weight1 [H, L*F1]  whose storage is L blocks [H, F1], block j expert j's
//                                      linear_fc1.weight [F1, H] transposed (F1 = F/TP, or
//                                      2F/TP for GLU: the rank's [gate_r | up_r] columns);
//       mlp.experts.weight2 [L*F/TP, H] whose storage is L blocks [F/TP, H], block j expert j's
//                                      linear_fc2.weight [H, F/TP] transposed;
//     L the local experts of the file's expert-parallel rank. Its sharded_state_dict maps them
//     onto SequentialMLP's linear_fc1/linear_fc2 the same way (view [L, H, F1], transpose).
//   - TEGroupedMLP (the Transformer Engine spec): one GroupedLinear per linear, each expert's
//     weight its own parameter shaped as SequentialMLP's, mlp.experts.linear_fc1.weight<j>
//     (bias<j>), then its _extra_state (transformer_engine/pytorch/module/grouped_linear.py).
//
// Reading turns GroupedMLP's tensors into per-expert views of the same storage (a transposed
// stride, nothing copied) under SequentialMLP's names, in the model state dict and in the
// optimizer state torch saved for them (the moments and mixed precision's fp32 copies are
// shaped like the parameter); TEGroupedMLP's are a rename. Everything after that (TP and EP
// resharding, the optimizer's parameter groups) is SequentialMLP's. Writing does the inverse
// when the saved Namespace has moe_grouped_gemm: GroupedMLP's two tensors per layer for
// transformer_impl 'local' (what tessera's Namespace holds), TEGroupedMLP's names for
// 'transformer_engine'.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "tessera/ckpt/megatron_checkpoint.h"

namespace tessera {

class TorchFile;

// A layer's TEGroupedMLP name (after "decoder.layers.N.") as SequentialMLP's:
// "mlp.experts.linear_fc1.weight3" -> "mlp.experts.local_experts.3.linear_fc1.weight" (bias
// likewise); nullopt for other names.
std::optional<std::string> sequential_name_of_te_grouped(const std::string& rest);

// Whether a layer's name (after "decoder.layers.N.") is GroupedMLP's weight1 or weight2.
bool is_grouped_mlp_weight(const std::string& rest);

// Megatron's weight-decay class of a parameter (megatron/core/optimizer/__init__.py
// _get_param_groups): every parameter but biases and 1-D ones.
bool megatron_decays_weight(const std::string& key, size_t dims);

// Rewrites file `f`'s GroupedMLP tensors (every model chunk's, and their optimizer state: torch's
// per-parameter state, its parameter groups' indices, fp32_from_fp16_params) into views under
// SequentialMLP's names, local_experts experts per layer. Returns whether it found any. Errors
// name the file and the entry.
bool expand_grouped_mlp_weights(TorchFile& f, int local_experts);

// A file's parameters (megatron_checkpoint.h's MegatronParam, SequentialMLP's names, a rank's
// experts numbered from 0) as megatron-core's grouped module for `args` holds them; unchanged
// unless args["moe_grouped_gemm"]. GroupedMLP's tensors (and their optimizer state) are new host
// copies, which `storage` owns.
struct GroupedMegatronParams {
  std::vector<MegatronParam> params;
  std::vector<std::vector<float>> storage;
};
GroupedMegatronParams group_megatron_experts(const nlohmann::json& args, const std::vector<MegatronParam>& params);

}  // namespace tessera
