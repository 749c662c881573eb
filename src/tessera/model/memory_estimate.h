// How much memory a GPT needs per rank, computed from its config and this rank's share
// without allocating: the model's own slab layout (GPTModel::slab_sizes: parameters,
// gradients, every activation slot the pipeline keeps in flight) plus what the optimizer
// holds. A unit test holds the figures equal to what a constructed GPTModel allocates.
//
// Bytes per parameter, as Megatron counts them (megatron/training/theoretical_memory_usage.py)
// for a 16-bit model: 2 (weight) + 4 (f32 gradient) + 4 (f32 main parameter) + 8 (Adam's
// exp_avg and exp_avg_sq) = 18; with the distributed optimizer the last 12 are sharded over
// the data-parallel ranks: 6 + 12/DP. An f32 model is its own main parameter (16, and
// 8 + 8/DP). tessera's distributed optimizer adds 4/DP for the shard it reduce-scatters into.
// Under expert parallelism a rank holds E/EP experts of each MoE layer, whose optimizer state
// the distributed optimizer shards over the expert data-parallel ranks, and the dispatcher's
// buffers sized for the most rows the EP ranks can send it (EP times its own).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "tessera/model/gpt_config.h"
#include "tessera/device/device.h"
#include "tessera/model/model_partition.h"
#include "tessera/parallel/grad_buffer_layout.h"

namespace tessera {

struct GPTMemoryEstimate {
  int64_t num_parameters = 0;       // held by this rank
  size_t parameter_bytes = 0;       // the parameter slab, in the model's dtype
  size_t gradient_bytes = 0;        // the f32 gradient slab (and the distributed optimizer's reduced shard)
  size_t main_parameter_bytes = 0;  // the optimizer's f32 copy of 16-bit parameters
  size_t optimizer_bytes = 0;       // Adam: two f32 states per parameter
  size_t activation_bytes = 0;      // every activation slot and workspace
  int64_t expert_parameters = 0;    // of num_parameters: this rank's experts'
  size_t moe_dispatch_bytes = 0;    // of activation_bytes: expert parallelism's dispatcher buffers
  size_t weight_and_optimizer_bytes() const {
    return parameter_bytes + gradient_bytes + main_parameter_bytes + optimizer_bytes;
  }
  size_t total_bytes() const { return weight_and_optimizer_bytes() + activation_bytes; }
};

// The whole model on one rank, one micro-batch in flight.
GPTMemoryEstimate estimate_gpt_memory(const GPTConfig& config, int micro_batch_size);
// One rank's share with the given activation and I/O slots per chunk. buffers: the layout
// of its parameter and gradient buffers, which also says whether the distributed optimizer
// shards the optimizer's state over data_parallel ranks. device: the backend that will run
// it (attention's saved state is the backend's to size: ops::attention_buffers).
GPTMemoryEstimate estimate_gpt_memory(const GPTConfig& config, int micro_batch_size, const ModelPartition& partition,
                                      const std::vector<int>& act_slots, const std::vector<int>& io_slots,
                                      const GradBufferOptions& buffers = {}, const Device& device = cpu_device());

}  // namespace tessera
