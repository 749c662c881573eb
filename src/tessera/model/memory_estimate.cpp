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
  r({B, T, C});  // embedded
  for (int l = 0; l < config.num_layers; ++l) {
    r({B, T, C});        // ln1
    r({B, T});           // ln1_mean
    r({B, T});           // ln1_rstd
    r({B, T, 3 * A});    // qkv
    r({B, NH, T, T});    // att
    r({B, T, A});        // ctx
    r({B, T, C});        // residual_mid
    r({B, T, C});        // ln2
    r({B, T});           // ln2_mean
    r({B, T});           // ln2_rstd
    r({B, T, F});        // fc1
    r({B, T, F});        // gelu
  }
  for (int l = 0; l + 1 < config.num_layers; ++l) r({B, T, C});  // residual_in of layers 1..L-1
  r({B, T, C});      // residual_out
  r({B, T, C});      // lnf
  r({B, T});         // lnf_mean
  r({B, T});         // lnf_rstd
  r({B, T, V});      // logits
  r({B, T});         // losses
  r({B, T, C});      // scratch_C
  r({B, T, C});      // d_residual
  r({B, T, C});      // d_C
  r({B, T, C});      // d_ln
  r({B, T, A});      // d_ctx
  r({B, T, 3 * A});  // d_qkv
  r({B, NH, T, T});  // d_att
  r({B, T, F});      // d_F
  r({B, T, F});      // d_gelu
  r({B, T, V});      // d_logits
  r({B, T});         // d_losses
  e.activation_bytes = acts.total_bytes();
  return e;
}

}  // namespace tessera
