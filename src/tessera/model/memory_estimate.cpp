#include "tessera/model/memory_estimate.h"

#include "tessera/model/gpt.h"

namespace tessera {

GPTMemoryEstimate estimate_gpt_memory(const GPTConfig& config, int micro_batch_size, const ModelPartition& partition,
                                      const std::vector<int>& act_slots, const std::vector<int>& io_slots,
                                      const GradBufferOptions& buffers, const Device& device) {
  const GPTSlabSizes sizes =
      GPTModel::slab_sizes(config, micro_batch_size, partition, act_slots, io_slots, buffers, device);
  const int shards = buffers.distributed_optimizer ? buffers.data_parallel : 1;
  // f32 bytes of this rank's share of the optimizer's per-parameter state: 1/DP of each bucket
  // (1/expert DP of the experts').
  size_t f32_share = sizes.grads;
  if (buffers.distributed_optimizer) {
    const GradBufferLayout layout = GPTModel::buffer_layout_for(config, partition, buffers);
    f32_share = 0;
    for (size_t b = 0; b < layout.buckets.size(); ++b)
      f32_share += static_cast<size_t>(layout.buckets[b].numel() / layout.group_size(b)) * sizeof(float);
  }
  GPTMemoryEstimate e;
  e.num_parameters = sizes.num_parameters;
  for (const ParamShard& s : shard_params(config, partition))
    if (s.is_expert) e.expert_parameters += s.numel();
  if (partition.ep_size > 1) {  // the activations differ from EP 1's by the dispatcher's buffers alone
    ModelPartition one = partition;
    one.ep_size = 1;
    one.ep_rank = 0;
    e.moe_dispatch_bytes =
        sizes.activations - GPTModel::slab_sizes(config, micro_batch_size, one, act_slots, io_slots, buffers, device).activations;
  }
  e.parameter_bytes = sizes.params;
  // The distributed optimizer reduce-scatters into a shard of its own (1/DP of the gradient
  // buffer; Megatron reduces in place, which Gloo cannot).
  e.gradient_bytes = sizes.grads + (shards > 1 ? f32_share : 0);
  e.main_parameter_bytes = config.params_dtype == DType::F32 ? 0 : f32_share;
  e.optimizer_bytes = 2 * f32_share;
  e.activation_bytes = sizes.activations;
  return e;
}

GPTMemoryEstimate estimate_gpt_memory(const GPTConfig& config, int micro_batch_size) {
  return estimate_gpt_memory(config, micro_batch_size, ModelPartition::whole(config), {1}, {1});
}

}  // namespace tessera
