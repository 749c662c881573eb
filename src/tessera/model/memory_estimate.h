// How much memory a GPT needs per rank, computed from its config and this rank's share
// without allocating: the model's own slab layout (GPTModel::slab_sizes: parameters,
// gradients, every activation slot the pipeline keeps in flight) plus Adam's exp_avg and
// exp_avg_sq. A unit test holds the figures equal to what a constructed GPTModel allocates.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "tessera/model/gpt_config.h"
#include "tessera/model/model_partition.h"

namespace tessera {

struct GPTMemoryEstimate {
  int64_t num_parameters = 0;   // held by this rank
  size_t parameter_bytes = 0;   // f32 parameter slab
  size_t gradient_bytes = 0;    // f32 gradient slab (same layout)
  size_t optimizer_bytes = 0;   // Adam: two f32 states per parameter
  size_t activation_bytes = 0;  // every activation slot and workspace
  size_t total_bytes() const { return parameter_bytes + gradient_bytes + optimizer_bytes + activation_bytes; }
};

// The whole model on one rank, one micro-batch in flight.
GPTMemoryEstimate estimate_gpt_memory(const GPTConfig& config, int micro_batch_size);
// One rank's share with the given activation and I/O slots per chunk.
GPTMemoryEstimate estimate_gpt_memory(const GPTConfig& config, int micro_batch_size, const ModelPartition& partition,
                                      const std::vector<int>& act_slots, const std::vector<int>& io_slots);

}  // namespace tessera
