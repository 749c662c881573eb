// How much memory a GPT needs per rank, computed from its config without allocating:
// the same slab layouts GPTModel's constructor and the optimizer reserve (parameters,
// gradients, Adam's exp_avg and exp_avg_sq, one micro-batch of activations). A unit test
// holds the parameter, gradient and activation figures equal to what a constructed GPTModel
// allocates, so the two cannot drift.
#pragma once

#include <cstddef>
#include <cstdint>

#include "tessera/model/gpt_config.h"

namespace tessera {

struct GPTMemoryEstimate {
  int64_t num_parameters = 0;
  size_t parameter_bytes = 0;   // f32 parameter slab
  size_t gradient_bytes = 0;    // f32 gradient slab (same layout)
  size_t optimizer_bytes = 0;   // Adam: two f32 states per parameter
  size_t activation_bytes = 0;  // one micro-batch's activation slab
  size_t total_bytes() const { return parameter_bytes + gradient_bytes + optimizer_bytes + activation_bytes; }
};

GPTMemoryEstimate estimate_gpt_memory(const GPTConfig& config, int micro_batch_size);

}  // namespace tessera
