// A tiny GPT and a deterministic micro-batch for the model's unit tests (dropout on, so the
// counter-keyed masks are exercised; every fifth token masked out of the loss).
#pragma once

#include <cstdint>
#include <vector>

#include "tessera/device/device.h"
#include "tessera/model/gpt.h"

namespace tessera::testing_gpt {

inline GPTConfig tiny(int layers) {
  GPTConfig c;
  c.num_layers = layers;
  c.hidden_size = 16;
  c.num_attention_heads = 4;
  c.kv_channels = 4;
  c.ffn_hidden_size = 32;
  c.seq_length = 8;
  c.max_position_embeddings = 8;
  c.vocab_size = 29;
  c.padded_vocab_size = 32;
  c.hidden_dropout = 0.2f;
  c.attention_dropout = 0.2f;
  return c;
}

// A Llama-like tiny model: RMSNorm, RoPE, SwiGLU, 2 query groups of 2 heads, no biases, untied.
inline GPTConfig tiny_llama(int layers) {
  GPTConfig c = tiny(layers);
  c.num_query_groups = 2;
  c.normalization = Normalization::RMSNorm;
  c.position_embedding = PositionEmbedding::Rope;
  c.swiglu = true;
  c.add_bias_linear = false;
  c.untie_embeddings_and_output_weights = true;
  return c;
}

constexpr int B = 2;  // micro-batch

// Owns the batch's host vectors; view() is the MicroBatch the model reads.
struct Batch {
  std::vector<int32_t> tokens, positions, labels;
  std::vector<float> mask;
  MicroBatch view() {
    Device* d = &cpu_device();
    const int64_t T = static_cast<int64_t>(tokens.size()) / B;
    return {Tensor(tokens.data(), DType::I32, {B, T}, d), Tensor(positions.data(), DType::I32, {B, T}, d),
            Tensor(labels.data(), DType::I32, {B, T}, d), Tensor(mask.data(), DType::F32, {B, T}, d)};
  }
};

inline Batch make_batch(const GPTConfig& c) {
  Batch b;
  for (int i = 0; i < B * c.seq_length; ++i) {
    b.tokens.push_back((i * 7 + 3) % c.vocab_size);
    b.positions.push_back(i % c.seq_length);
    b.labels.push_back((i * 5 + 1) % c.vocab_size);
    b.mask.push_back(i % 5 == 4 ? 0.0f : 1.0f);
  }
  return b;
}

}  // namespace tessera::testing_gpt
