#include "tessera/model/memory_estimate.h"

#include "tessera/core/tensor.h"

namespace tessera {

GPTMemoryEstimate estimate_gpt_memory(const GPTConfig& config, int micro_batch_size) {
  GPTMemoryEstimate e;
  SlabBuilder params;
  for (const ParamSpec& s : gpt_param_specs(config)) {
    params.reserve(DType::F32, s.shape);
    int64_t n = 1;
    for (int64_t d : s.shape) n *= d;
    e.num_parameters += n;
  }
  e.parameter_bytes = params.total_bytes();
  e.gradient_bytes = params.total_bytes();
  e.optimizer_bytes = 2 * params.total_bytes();

  // Mirrors GPTModel's activation reservations, in the same order (alignment depends on it).
  const int64_t B = micro_batch_size, T = config.seq_length, C = config.hidden_size;
  const int64_t A = config.attention_width(), F = config.ffn_hidden_size, V = config.padded_vocab_size;
  const int64_t NH = config.num_attention_heads;
  SlabBuilder acts;
  auto r = [&](Shape shape) { acts.reserve(DType::F32, shape); };
  r({B, T, C});
  for (int l = 0; l < config.num_layers; ++l) {
    r({B, T, C}), r({B, T}), r({B, T}), r({B, T, 3 * A}), r({B, NH, T, T}), r({B, T, A});
    r({B, T, C}), r({B, T, C}), r({B, T}), r({B, T}), r({B, T, F}), r({B, T, F});
  }
  for (int l = 0; l + 1 < config.num_layers; ++l) r({B, T, C});
  r({B, T, C}), r({B, T, C}), r({B, T}), r({B, T}), r({B, T, V}), r({B, T}), r({B, T, C});
  r({B, T, C}), r({B, T, C}), r({B, T, C}), r({B, T, A}), r({B, T, 3 * A}), r({B, NH, T, T});
  r({B, T, F}), r({B, T, F}), r({B, T, V}), r({B, T});
  e.activation_bytes = acts.total_bytes();
  return e;
}

}  // namespace tessera
