#include "tessera/model/memory_estimate.h"

#include "tessera/model/gpt.h"

namespace tessera {

GPTMemoryEstimate estimate_gpt_memory(const GPTConfig& config, int micro_batch_size, const ModelPartition& partition,
                                      const std::vector<int>& act_slots, const std::vector<int>& io_slots,
                                      const GradBufferOptions& buffers, const Device& device) {
  const GPTSlabSizes sizes =
      GPTModel::slab_sizes(config, micro_batch_size, partition, act_slots, io_slots, buffers, device);
  const int shards = buffers.distributed_optimizer ? buffers.data_parallel : 1;
  // f32 bytes of this rank's share of the optimizer's per-parameter state.
  const size_t f32_share = sizes.grads / static_cast<size_t>(shards);
  GPTMemoryEstimate e;
  e.num_parameters = sizes.num_parameters;
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
