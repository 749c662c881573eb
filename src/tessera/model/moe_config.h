// MoEConfig: the mixture-of-experts shape of Megatron's GPT (core_r0.10.0's
// megatron/core/transformer/moe/, the --num-experts / --moe-* flags of
// megatron/training/arguments.py): which layers replace their MLP by a router and experts,
// how tokens are routed, balanced and dropped. num_experts == 0 is the dense model.
#pragma once

#include <cstdint>
#include <vector>

namespace tessera {

// --moe-router-load-balancing-type (sinkhorn is refused by the parser).
enum class MoELoadBalancing { AuxLoss, None };
// --moe-token-drop-policy: which tokens an expert over its capacity drops.
enum class MoEDropPolicy { Probs, Position };
// --moe-token-dispatcher-type: how tokens reach the experts of other expert-parallel ranks
// (both give the same result; capacity dropping needs alltoall, as in Megatron).
enum class MoEDispatcher { AllGather, AllToAll };

struct MoEConfig {
  int num_experts = 0;  // 0: no MoE layer
  int topk = 2;
  // Softmax over all experts, then the top-k of the probabilities (--moe-router-pre-softmax);
  // else the top-k logits, then a softmax over those k (Megatron's default).
  bool pre_softmax = false;
  MoELoadBalancing load_balancing = MoELoadBalancing::AuxLoss;
  double aux_loss_coeff = 0.0;
  double z_loss_coeff = 0.0;  // 0: no z-loss (Megatron's None)
  int ffn_hidden_size = 0;    // each expert's (--moe-ffn-hidden-size; default --ffn-hidden-size)
  std::vector<bool> moe_layers;  // per layer: MoE (true) or dense, from --moe-layer-freq
  int shared_expert_size = 0;    // --moe-shared-expert-intermediate-size (0: none)
  // Qwen2-MoE's sigmoid gate on the shared experts' output (Megatron's SharedExpertMLP with
  // gate=True: a [1, H] gate_weight); set by --moe-shared-expert-gate or a Qwen2-MoE import.
  bool shared_expert_gate = false;
  double capacity_factor = 0.0;  // <= 0: no capacity, nothing dropped
  bool pad_to_capacity = false;
  MoEDropPolicy drop_policy = MoEDropPolicy::Probs;
  MoEDispatcher dispatcher = MoEDispatcher::AllGather;
  int expert_parallel_size = 1;

  bool enabled() const { return num_experts > 0; }
  bool is_moe_layer(int layer) const {
    return enabled() && layer >= 0 && layer < static_cast<int>(moe_layers.size()) && moe_layers[layer];
  }
  int num_moe_layers() const {
    int n = 0;
    for (bool m : moe_layers) n += m;
    return enabled() ? n : 0;
  }
};

}  // namespace tessera
