// Activation recomputation (--recompute-granularity selective|full, --recompute-method
// uniform|block): the same loss and gradients as keeping everything, to the bit (the
// recomputed forward runs the same operations on the same inputs with the same
// counter-keyed dropout masks), with fewer activation bytes. Run on the whole model and on a
// tensor-parallel, sequence-parallel one (the recomputed forward communicates too).
#include <gtest/gtest.h>

#include <cstring>
#include <mutex>
#include <vector>

#include "tessera/comm/in_process/in_process_communicator.h"
#include "tessera/device/device.h"
#include "tessera/model/gpt.h"

namespace tessera {
namespace {

GPTConfig tiny() {
  GPTConfig c;
  c.num_layers = 5;
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

struct Result {
  double loss;
  std::vector<float> grads;
  size_t activation_bytes;
};

Result run(const GPTConfig& c, Communicator* tp) {
  constexpr int B = 2;
  ModelPartition part = ModelPartition::whole(c);
  if (tp) part.tp_size = tp->size(), part.tp_rank = tp->rank(), part.sequence_parallel = true;
  GPTModel model(c, cpu_device(), B, part, {1}, {1}, tp);
  model.init_weights();
  model.zero_grads();
  std::vector<int32_t> tokens, positions, labels;
  std::vector<float> mask;
  for (int i = 0; i < B * c.seq_length; ++i) {
    tokens.push_back((i * 7 + 3) % c.vocab_size);
    positions.push_back(i % c.seq_length);
    labels.push_back((i * 5 + 1) % c.vocab_size);
    mask.push_back(1.0f);
  }
  Device* d = &cpu_device();
  const int64_t T = c.seq_length;
  MicroBatch mb{Tensor(tokens.data(), DType::I32, {B, T}, d), Tensor(positions.data(), DType::I32, {B, T}, d),
                Tensor(labels.data(), DType::I32, {B, T}, d), Tensor(mask.data(), DType::F32, {B, T}, d)};
  const StepContext step{2, 0, true};
  Result r;
  r.loss = model.forward(mb, step);
  model.backward(mb, step, 0.05f);
  for (const Tensor& g : model.grads()) r.grads.insert(r.grads.end(), g.f32(), g.f32() + g.numel());
  r.activation_bytes = model.activation_bytes();
  return r;
}

GPTConfig with(Recompute what, RecomputeMethod method, int n) {
  GPTConfig c = tiny();
  c.recompute = what;
  c.recompute_method = method;
  c.recompute_num_layers = n;
  return c;
}

const std::vector<GPTConfig> kVariants = {
    with(Recompute::Selective, RecomputeMethod::Uniform, 1), with(Recompute::Full, RecomputeMethod::Uniform, 1),
    with(Recompute::Full, RecomputeMethod::Uniform, 2),      with(Recompute::Full, RecomputeMethod::Block, 3),
};

void expect_same(const Result& a, const Result& b, size_t variant) {
  EXPECT_EQ(a.loss, b.loss) << "variant " << variant;
  ASSERT_EQ(a.grads.size(), b.grads.size());
  EXPECT_EQ(0, std::memcmp(a.grads.data(), b.grads.data(), a.grads.size() * sizeof(float))) << "variant " << variant;
  EXPECT_LT(b.activation_bytes, a.activation_bytes) << "variant " << variant;
}

TEST(Recompute, SameBitsFewerActivationBytes) {
  const Result plain = run(tiny(), nullptr);
  for (size_t v = 0; v < kVariants.size(); ++v) expect_same(plain, run(kVariants[v], nullptr), v);
}

TEST(Recompute, TensorAndSequenceParallel) {
  std::mutex mu;
  run_in_process_ranks(2, [&](Communicator& comm) {
    const Result plain = run(tiny(), &comm);
    for (size_t v = 0; v < kVariants.size(); ++v) {
      const Result r = run(kVariants[v], &comm);
      std::lock_guard<std::mutex> lock(mu);
      expect_same(plain, r, v);
    }
  });
}

}  // namespace
}  // namespace tessera
