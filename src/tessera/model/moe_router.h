// The MoE router's decisions, on the host: Megatron's TopKRouter
// (megatron/core/transformer/moe/router.py) and topk_softmax_with_capacity,
// switch_load_balancing_loss_func and z_loss_func (moe_utils.py), and their gradients.
// The router's logits [N, E] are small (E per token): the model reads them back once per MoE
// layer and micro-batch, as Megatron's dispatchers read tokens_per_expert back to size the
// experts' GEMMs, and uploads the maps the permute ops (ops.inc moe_*) follow.
//
// Tokens are the rows n of the layer's [B*T, H] input (b-major). Megatron's router sees its
// tokens s-major ([S, B, H]): `megatron_order` lists the rows in that order, one routing group
// per tensor-parallel rank's sequence slice (capacity is per group, as Megatron computes it
// per rank; the aux loss's token counts are summed over the groups, as Megatron all-reduces
// them over the tensor-parallel group). Under context parallelism a rank holds part of each
// sequence: join_sequence_partition counts the aux loss's tokens over the CP ranks too.
#pragma once

#include <cstdint>
#include <vector>

#include "tessera/model/moe_config.h"

namespace tessera {

struct MoERouting {
  int64_t num_tokens = 0;  // N
  int topk = 0;            // k
  int num_experts = 0;     // E
  // Per route r = n*k + j: the expert and its routing weight (Megatron's probs after the
  // capacity mask: 0 where dropped), and the permuted row holding it (-1: dropped).
  std::vector<int32_t> expert, slot;
  std::vector<float> weight;
  // Per permuted row: the route it holds (-1: padding to capacity); experts' rows contiguous.
  std::vector<int32_t> source;
  std::vector<int64_t> rows_per_expert;    // [E], sums to source.size()
  std::vector<int64_t> tokens_per_expert;  // [E] routed before dropping (the aux loss's counts)
  std::vector<double> prob_sums;           // [E] the softmax scores summed over the tokens
  // The aux loss's sequence partition (Megatron's sequence_partition_group, TP x CP; TP is
  // within the N tokens already): its token count, its tokens per expert, and how many
  // context-parallel ranks share it.
  int64_t partition_tokens = 0;
  std::vector<int64_t> partition_tokens_per_expert;
  int partition_parts = 1;
  double load_balancing_loss = 0;  // the aux loss divided by its coefficient (what Megatron logs)
  double z_loss = 0;               // mean of logsumexp(logits)^2 (Megatron logs z_loss / coefficient)
};

// The rows of a [B, T] micro-batch in Megatron's [S, B] order, split into `groups` sequence
// slices (tensor-parallel ranks under sequence parallelism; 1 otherwise).
std::vector<std::vector<int64_t>> megatron_token_groups(int64_t B, int64_t T, int groups);

// Routes N tokens given their router logits [N, E] (row-major, f32 as Megatron's softmax).
MoERouting route_tokens(const MoEConfig& config, const float* logits, int64_t N,
                        const std::vector<std::vector<int64_t>>& groups);

// Megatron's switch_load_balancing_loss_func over a sequence split into `parts` context-parallel
// ranks: counts [E] and prob_sums [E] are the tokens per expert and the score sums of the whole
// partition (summed over the ranks), N is scaled by `parts`, and load_balancing_loss becomes the
// whole partition's (what Megatron logs after summing each rank's over its reduce_group).
void join_sequence_partition(MoERouting& routing, const std::vector<int64_t>& counts,
                             const std::vector<double>& prob_sums, int parts);

// dL/dlogits [N, E] (assigned): through the routing weights (dweights [N, k], the gradient of
// the weights as the layer used them), plus the aux loss's and z-loss's gradients times
// aux_scale (Megatron's MoEAuxLossAutoScaler: the main loss's scale over micro-batches). Over a
// context-parallel partition each rank's aux gradient is its share of the whole partition's,
// times the CP size as the main loss is (Megatron's loss_func), so that the dp-cp averaging
// gives one process's gradient. (core_r0.10.0 leaves its aux loss unscaled, which makes the
// aux gradient under CP 1/CP of one process's.)
void route_backward(float* dlogits, const MoEConfig& config, const MoERouting& routing, const float* logits,
                    const float* dweights, double aux_scale);

// Megatron's get_capacity: ceil(tokens * k / E * factor).
int64_t expert_capacity(int64_t tokens, int topk, int experts, double factor);

}  // namespace tessera
