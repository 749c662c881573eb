#include "tessera/model/memory_estimate.h"

#include "tessera/model/gpt.h"

namespace tessera {

GPTMemoryEstimate estimate_gpt_memory(const GPTConfig& config, int micro_batch_size, const ModelPartition& partition,
                                      const std::vector<int>& act_slots, const std::vector<int>& io_slots) {
  const GPTSlabSizes sizes = GPTModel::slab_sizes(config, micro_batch_size, partition, act_slots, io_slots);
  GPTMemoryEstimate e;
  e.num_parameters = sizes.num_parameters;
  e.parameter_bytes = sizes.params;
  e.gradient_bytes = sizes.params;
  e.optimizer_bytes = 2 * sizes.params;
  e.activation_bytes = sizes.activations;
  return e;
}

GPTMemoryEstimate estimate_gpt_memory(const GPTConfig& config, int micro_batch_size) {
  return estimate_gpt_memory(config, micro_batch_size, ModelPartition::whole(config), {1}, {1});
}

}  // namespace tessera
