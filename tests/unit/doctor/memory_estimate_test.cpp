// estimate_gpt_memory against what a constructed GPTModel actually allocates.
#include "tessera/model/memory_estimate.h"

#include <gtest/gtest.h>

#include "tessera/device/device.h"
#include "tessera/model/gpt.h"

namespace tessera {
namespace {

GPTConfig tiny(int layers, bool untie) {
  GPTConfig c;
  c.num_layers = layers;
  c.hidden_size = 24;
  c.num_attention_heads = 3;
  c.kv_channels = 8;
  c.ffn_hidden_size = 72;
  c.seq_length = 7;
  c.max_position_embeddings = 9;
  c.vocab_size = 50;
  c.padded_vocab_size = 64;
  c.untie_embeddings_and_output_weights = untie;
  return c;
}

TEST(MemoryEstimate, EqualsWhatGPTModelAllocates) {
  for (int layers : {1, 3}) {
    for (bool untie : {false, true}) {
      for (int micro_batch : {1, 3}) {
        const GPTConfig c = tiny(layers, untie);
        Device& device = cpu_device();
        const size_t before = device.allocated_bytes();
        GPTModel model(c, device, micro_batch);
        const size_t used = device.allocated_bytes() - before;
        const GPTMemoryEstimate e = estimate_gpt_memory(c, micro_batch);
        EXPECT_EQ(e.num_parameters, model.num_parameters());
        EXPECT_EQ(e.activation_bytes, model.activation_bytes());
        EXPECT_EQ(e.parameter_bytes + e.gradient_bytes + e.activation_bytes, used)
            << "layers " << layers << " untie " << untie << " micro-batch " << micro_batch;
        EXPECT_EQ(e.optimizer_bytes, 2 * e.parameter_bytes);
      }
    }
  }
}

}  // namespace
}  // namespace tessera
