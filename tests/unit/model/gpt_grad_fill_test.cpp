// The default mode's partial gradient fill (GPTModel::zero_grads): a step's first backward of
// each chunk assigns the linears' weight gradients (ops.inc param_write) and the fill zeroes
// only the rest of the slab. Each layout runs its micro-batches on two copies of the model:
// one after zero_grads on a slab poisoned with NaN, one that never ran zero_grads over a slab
// zeroed by hand (every backward accumulates: the path without assignment). Every gradient
// must be finite and equal (+0 == -0): a tensor left out of the fill but not assigned stays
// NaN, one assigned although another op wrote it first (or assigned by a later micro-batch)
// loses a contribution. Layouts: GPT with tied embeddings, a Llama-like model (untied,
// SwiGLU, no biases), an MoE model with a shared expert, full recomputation, PP 2 stage by
// stage (tied and untied) and TP 2 with sequence parallelism. Dropout is on.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "tessera/comm/in_process/in_process_communicator.h"
#include "tessera/device/device.h"
#include "tessera/model/gpt.h"
#include "tiny_gpt.h"

namespace tessera {
namespace {

using testing_gpt::B;
using testing_gpt::Batch;

constexpr int kMicroBatches = 3;

// Micro-batch m: the tiny batch with its tokens and labels shifted by m.
Batch micro_batch(const GPTConfig& c, int m) {
  Batch b = testing_gpt::make_batch(c);
  for (int32_t& t : b.tokens) t = (t + m) % c.vocab_size;
  for (int32_t& t : b.labels) t = (t + 3 * m) % c.vocab_size;
  return b;
}

// A pipeline's stages (one for the whole model).
using Stages = std::vector<std::unique_ptr<GPTModel>>;

// The step's micro-batches, stage by stage, with the activations and their gradients handed
// over by hand.
void run_micro_batches(const Stages& stages, const GPTConfig& c) {
  for (int m = 0; m < kMicroBatches; ++m) {
    Batch batch = micro_batch(c, m);
    StepContext step{3, static_cast<uint32_t>(m), true};
    step.last_micro_batch = m + 1 == kMicroBatches;
    double sums[2] = {0.0, 0.0};
    const size_t n = stages.size();
    for (size_t r = 0; r < n; ++r) {
      if (r > 0) {
        const Tensor from = stages[r - 1]->chunk_output(0, 0), to = stages[r]->chunk_input(0, 0);
        std::memcpy(to.host<void>(), from.host<void>(), from.bytes());
      }
      stages[r]->forward(0, {}, batch.view(), step, Tensor(sums, DType::I64, {2}, &cpu_device()));
    }
    for (size_t r = n; r-- > 0;) {
      if (r + 1 < n) {
        const Tensor from = stages[r + 1]->chunk_input_grad(0, 0), to = stages[r]->chunk_output_grad(0, 0);
        std::memcpy(to.host<void>(), from.host<void>(), from.bytes());
      }
      stages[r]->backward(0, {}, batch.view(), step, 0.1f);
    }
  }
}

void fill_slab(GPTModel& model, float value) {
  const Tensor g = model.grad_buffer();
  std::fill(g.host<float>(), g.host<float>() + g.numel(), value);
}

// The step after zero_grads over a NaN slab against the accumulating one over zeros; make()
// builds the layout's stages, initialised.
void expect_partial_fill_matches(const std::function<Stages()>& make, const GPTConfig& c, const std::string& what) {
  const Stages filled = make(), summed = make();
  for (const auto& s : filled) {
    fill_slab(*s, std::numeric_limits<float>::quiet_NaN());
    s->zero_grads();
  }
  for (const auto& s : summed) fill_slab(*s, 0.0f);
  run_micro_batches(filled, c);
  run_micro_batches(summed, c);
  for (size_t r = 0; r < filled.size(); ++r) {
    const GPTModel& got = *filled[r];
    for (size_t i = 0; i < got.shards().size(); ++i) {
      const Tensor &g = got.grads()[i], &want = summed[r]->grads()[i];
      int64_t bad = 0;
      for (int64_t e = 0; e < g.numel(); ++e) bad += !(g.host<float>()[e] == want.host<float>()[e]);
      EXPECT_EQ(bad, 0) << what << " stage " << r << ": " << got.shards()[i].spec.name << " differs in " << bad
                        << " of " << g.numel() << " elements";
    }
    // Padding between the parameters (the layout's alignment) is filled too.
    const Tensor slab = got.grad_buffer();
    const int64_t nans = std::count_if(slab.host<float>(), slab.host<float>() + slab.numel(),
                                       [](float v) { return std::isnan(v); });
    EXPECT_EQ(nans, 0) << what << " stage " << r << ": NaN left in the gradient slab";
  }
}

GPTConfig tiny_llama() {
  GPTConfig c = testing_gpt::tiny_llama(2);
  c.ffn_hidden_size = 12;
  return c;
}

GPTConfig tiny_moe() {
  GPTConfig c = testing_gpt::tiny(2);
  c.moe.num_experts = 4;
  c.moe.topk = 2;
  c.moe.ffn_hidden_size = 8;
  c.moe.moe_layers = {true, false};
  c.moe.shared_expert_size = 8;
  c.moe.aux_loss_coeff = 0.01;
  return c;
}

TEST(GradFill, WholeModels) {
  GPTConfig recomputed = testing_gpt::tiny(2);
  recomputed.recompute = Recompute::Full;
  recomputed.recompute_method = RecomputeMethod::Uniform;
  recomputed.recompute_num_layers = 1;
  const std::vector<std::pair<std::string, GPTConfig>> configs = {
      {"gpt tied", testing_gpt::tiny(2)}, {"llama", tiny_llama()}, {"moe", tiny_moe()}, {"recompute", recomputed}};
  for (const auto& [what, c] : configs) {
    expect_partial_fill_matches(
        [&] {
          Stages whole;
          whole.push_back(std::make_unique<GPTModel>(c, cpu_device(), B));
          whole.back()->init_weights();
          return whole;
        },
        c, what);
  }
}

TEST(GradFill, PipelineStages) {
  for (bool untie : {false, true}) {
    GPTConfig c = testing_gpt::tiny(4);
    c.untie_embeddings_and_output_weights = untie;
    const auto make = [&] {
      Stages stages;
      PipelineSplit split;
      split.pp_size = 2;
      for (int r = 0; r < 2; ++r) {
        ModelPartition part;
        part.chunks = pipeline_chunks(c.num_layers, split, r);
        stages.push_back(
            std::make_unique<GPTModel>(c, cpu_device(), B, part, std::vector<int>{1}, std::vector<int>{1}, nullptr));
        stages.back()->init_weights();
      }
      return stages;
    };
    expect_partial_fill_matches(make, c, untie ? "pp 2 untied" : "pp 2 tied");
  }
}

TEST(GradFill, TensorParallelRanks) {
  const GPTConfig c = testing_gpt::tiny(2);
  run_in_process_ranks(2, [&](Communicator& comm) {
    ModelPartition part = ModelPartition::whole(c);
    part.tp_size = 2;
    part.tp_rank = comm.rank();
    part.sequence_parallel = true;
    const auto make = [&] {
      Stages rank;
      rank.push_back(
          std::make_unique<GPTModel>(c, cpu_device(), B, part, std::vector<int>{1}, std::vector<int>{1}, &comm));
      rank.back()->init_weights();
      return rank;
    };
    // Both ranks run the same calls (the region's collectives); each checks its own shards.
    expect_partial_fill_matches(make, c, "tp 2 sp rank " + std::to_string(comm.rank()));
  });
}

// GPTModel::hand_grad_squares: after a step of three micro-batches, each handed gradient's
// slot holds the sum of squares of that gradient as the step left it (the last micro-batch's
// backward added it, the others nothing), within sum_squares' 1e-12 relative; the other slots
// stay zero. Handed: each layer's QKV and projection weights, and fc1 and fc2 of a dense MLP
// (an MoE layer's experts may get no token).
TEST(GradSquares, SlotsHoldTheLastBackwardsGradientSquares) {
  const std::vector<std::pair<std::string, GPTConfig>> configs = {
      {"gpt tied", testing_gpt::tiny(2)}, {"llama", tiny_llama()}, {"moe", tiny_moe()}};
  for (const auto& [what, c] : configs) {
    Stages whole;
    whole.push_back(std::make_unique<GPTModel>(c, cpu_device(), B));
    GPTModel& model = *whole[0];
    model.init_weights();
    const size_t n = model.shards().size();
    const std::vector<size_t> handed = model.squarable_grads();
    EXPECT_EQ(handed.size(), what == "moe" ? 6u : 8u) << what;  // the MoE model's layer 0 is MoE
    std::vector<int64_t> slot_of(n, -1);
    for (size_t i : handed) slot_of[i] = static_cast<int64_t>(i);
    std::vector<double> slots(n, 0.0);
    model.hand_grad_squares(Tensor(slots.data(), DType::I64, {static_cast<int64_t>(n)}, &cpu_device()), slot_of);
    fill_slab(model, std::numeric_limits<float>::quiet_NaN());
    model.zero_grads();
    run_micro_batches(whole, c);
    for (size_t i = 0; i < n; ++i) {
      const Tensor& g = model.grads()[i];
      double want = 0.0;
      for (int64_t e = 0; e < g.numel(); ++e) want += static_cast<double>(g.host<float>()[e]) * g.host<float>()[e];
      const std::string name = model.shards()[i].spec.name;
      if (slot_of[i] < 0) {
        EXPECT_EQ(slots[i], 0.0) << what << ": " << name;
        continue;
      }
      EXPECT_GT(want, 0.0) << what << ": " << name;
      EXPECT_NEAR(slots[i], want, 1e-12 * want) << what << ": " << name;
    }
  }
}

}  // namespace
}  // namespace tessera
