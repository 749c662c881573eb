// Activation recomputation (--recompute-granularity selective|full, --recompute-method
// uniform|block): the same loss and gradients as keeping everything, to the bit (the
// recomputed forward runs the same operations on the same inputs with the same
// counter-keyed dropout masks), with fewer activation bytes. Run on the whole model and on a
// tensor-parallel, sequence-parallel one (the recomputed forward communicates too). Selective
// recomputation drops the unfused attention's [B,NH,T,T] probabilities; the fused attention
// keeps none, so there it saves nothing: its bytes are checked in --deterministic-mode.
#include <gtest/gtest.h>

#include <cstring>
#include <mutex>
#include <vector>

#include "tessera/comm/in_process/in_process_communicator.h"
#include "tessera/device/device.h"
#include "tessera/model/gpt.h"
#include "tiny_gpt.h"

namespace tessera {
namespace {

GPTConfig tiny() { return testing_gpt::tiny(5); }

struct Result {
  double loss;
  std::vector<float> grads;
  size_t activation_bytes;
};

Result run(const GPTConfig& c, Communicator* tp) {
  using testing_gpt::B;
  ModelPartition part = ModelPartition::whole(c);
  if (tp) part.tp_size = tp->size(), part.tp_rank = tp->rank(), part.sequence_parallel = true;
  GPTModel model(c, cpu_device(), B, part, {1}, {1}, tp);
  model.init_weights();
  model.zero_grads();
  testing_gpt::Batch batch = testing_gpt::make_batch(c);
  const MicroBatch mb = batch.view();
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
  if (kVariants[variant].recompute == Recompute::Selective &&
      GPTModel::uses_fused_attention(kVariants[variant], cpu_device()))
    EXPECT_EQ(b.activation_bytes, a.activation_bytes) << "variant " << variant;
  else
    EXPECT_LT(b.activation_bytes, a.activation_bytes) << "variant " << variant;
}

// The CPU device in --deterministic-mode for one scope.
struct DeterministicMode {
  DeterministicMode() { cpu_device().set_deterministic_mode(true); }
  ~DeterministicMode() { cpu_device().set_deterministic_mode(false); }
};

TEST(Recompute, SameBitsFewerActivationBytes) {
  const Result plain = run(tiny(), nullptr);
  for (size_t v = 0; v < kVariants.size(); ++v) expect_same(plain, run(kVariants[v], nullptr), v);
}

TEST(Recompute, SameBitsFewerActivationBytesInDeterministicMode) {
  const DeterministicMode unfused;
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
