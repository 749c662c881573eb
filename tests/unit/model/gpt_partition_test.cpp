// The sharded model against the whole one, in one process (ranks as threads): for TP in
// {2, 4} with and without sequence parallelism, every rank's loss, logits slice and every
// parameter's gradient slice equal the whole model's (column-parallel QKV/fc1,
// row-parallel proj/fc2 with the bias after the reduction, vocabulary-parallel embedding and
// cross-entropy, the region communication); then the model cut into pipeline chunks, run
// stage by stage with the activations and their gradients handed over by hand, gives the
// whole model's loss and gradients bit for bit; and the sequence split over context-parallel
// ranks (CP 2 and 4, the fused ring and the gathered unfused attention, GPT and a Llama-like
// model with RoPE and grouped queries): the ranks' losses and gradients add up to the whole
// model's. Dropout is on throughout.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <map>
#include <mutex>
#include <vector>

#include "tessera/comm/in_process/in_process_communicator.h"
#include "tessera/device/device.h"
#include "tessera/model/context_parallel.h"
#include "tessera/model/gpt.h"
#include "tiny_gpt.h"

namespace tessera {
namespace {

using testing_gpt::B;
using testing_gpt::Batch;
using testing_gpt::make_batch;
GPTConfig tiny() { return testing_gpt::tiny(2); }

const StepContext kStep{3, 4, true};

// The whole model's loss, logits and full gradients.
struct Whole {
  double loss;
  std::vector<float> logits;
  std::map<std::string, std::vector<float>> grads;
};

Whole run_whole(const GPTConfig& c) {
  GPTModel model(c, cpu_device(), B);
  model.init_weights();
  model.zero_grads();
  Batch batch = make_batch(c);
  Whole w;
  w.loss = model.forward(batch.view(), kStep);
  const Tensor logits = model.logits();  // the backward overwrites them with their gradient
  w.logits.assign(logits.f32(), logits.f32() + logits.numel());
  model.backward(batch.view(), kStep, 0.1f);
  for (size_t i = 0; i < model.shards().size(); ++i)
    w.grads[model.shards()[i].spec.name].assign(model.grads()[i].f32(),
                                                model.grads()[i].f32() + model.grads()[i].numel());
  return w;
}

double relative_error(const float* got, const std::vector<float>& want) {
  double num = 0, den = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    num += (double(got[i]) - want[i]) * (double(got[i]) - want[i]);
    den += double(want[i]) * want[i];
  }
  return den == 0 ? std::sqrt(num) : std::sqrt(num / den);
}

class TensorParallelModel : public testing::TestWithParam<std::tuple<int, bool>> {};

TEST_P(TensorParallelModel, EveryRankMatchesTheWholeModel) {
  const auto [tp, sp] = GetParam();
  const GPTConfig c = tiny();
  const Whole whole = run_whole(c);
  std::mutex mu;
  run_in_process_ranks(tp, [&](Communicator& comm) {
    ModelPartition part = ModelPartition::whole(c);
    part.tp_size = tp;
    part.tp_rank = comm.rank();
    part.sequence_parallel = sp;
    GPTModel model(c, cpu_device(), B, part, {1}, {1}, &comm);
    model.init_weights();
    model.zero_grads();
    Batch batch = make_batch(c);
    const double loss = model.forward(batch.view(), kStep);
    const Tensor logits_t = model.logits();  // the backward overwrites them with their gradient
    const std::vector<float> logits(logits_t.f32(), logits_t.f32() + logits_t.numel());
    model.backward(batch.view(), kStep, 0.1f);
    // Replicated gradients under SP hold this rank's sequence slice: sum them as the
    // trainer does.
    for (size_t i = 0; i < model.shards().size(); ++i)
      if (model.shards()[i].grad_sums_over_tp) comm.all_reduce(model.grads()[i], ReduceOp::Sum);

    std::lock_guard<std::mutex> lock(mu);
    SCOPED_TRACE("tp " + std::to_string(tp) + " sp " + std::to_string(sp) + " rank " + std::to_string(comm.rank()));
    EXPECT_NEAR(loss, whole.loss, 1e-5 * std::abs(whole.loss));
    // Logits: this rank's vocabulary columns.
    const int64_t Vl = logits_t.dim(-1), rows_n = logits_t.numel() / Vl;
    std::vector<float> want;
    for (int64_t r = 0; r < rows_n; ++r)
      for (int64_t v = 0; v < Vl; ++v) want.push_back(whole.logits[r * c.padded_vocab_size + comm.rank() * Vl + v]);
    EXPECT_LT(relative_error(logits.data(), want), 1e-5);
    for (size_t i = 0; i < model.shards().size(); ++i) {
      const ParamShard& s = model.shards()[i];
      std::vector<float> slice(static_cast<size_t>(s.numel()));
      extract_shard(slice.data(), whole.grads.at(s.spec.name).data(), s);
      EXPECT_LT(relative_error(model.grads()[i].f32(), slice), 1e-5) << s.spec.name;
    }
  });
}

INSTANTIATE_TEST_SUITE_P(Layouts, TensorParallelModel,
                         testing::Combine(testing::Values(2, 4), testing::Values(false, true)));

// This CP rank's rows of a whole batch (get_batch_on_this_cp_rank).
Batch local_batch(const Batch& whole, int64_t S, int cp, int rank) {
  Batch b;
  const int64_t n = B * S / cp;
  b.tokens.resize(n), b.positions.resize(n), b.labels.resize(n), b.mask.resize(n);
  cp_local_rows(b.tokens.data(), whole.tokens.data(), B, S, cp, rank);
  cp_local_rows(b.positions.data(), whole.positions.data(), B, S, cp, rank);
  cp_local_rows(b.labels.data(), whole.labels.data(), B, S, cp, rank);
  cp_local_rows(b.mask.data(), whole.mask.data(), B, S, cp, rank);
  return b;
}

// (CP size, Llama-like, deterministic mode: the unfused attention on the gathered sequence)
class ContextParallelModel : public testing::TestWithParam<std::tuple<int, bool, bool>> {};

TEST_P(ContextParallelModel, RanksAddUpToTheWholeModel) {
  const auto [cp, llama, deterministic] = GetParam();
  GPTConfig c = llama ? testing_gpt::tiny_llama(2) : tiny();
  c.seq_length = c.max_position_embeddings = 16;
  cpu_device().set_deterministic_mode(deterministic);
  const Whole whole = run_whole(c);
  std::mutex mu;
  double loss_sum = 0.0;
  std::map<std::string, std::vector<double>> grad_sums;
  run_in_process_ranks(cp, [&](Communicator& comm) {
    ModelPartition part = ModelPartition::whole(c);
    part.cp_size = cp;
    part.cp_rank = comm.rank();
    GPTModel model(c, cpu_device(), B, part, {1}, {1}, nullptr, nullptr, &comm);
    model.init_weights();
    model.zero_grads();
    Batch batch = local_batch(make_batch(c), c.seq_length, cp, comm.rank());
    const double loss = model.forward(batch.view(), kStep);
    model.backward(batch.view(), kStep, 0.1f);
    std::lock_guard<std::mutex> lock(mu);
    loss_sum += loss;
    for (size_t i = 0; i < model.shards().size(); ++i) {
      std::vector<double>& sum = grad_sums[model.shards()[i].spec.name];
      sum.resize(static_cast<size_t>(model.grads()[i].numel()));
      for (size_t e = 0; e < sum.size(); ++e) sum[e] += model.grads()[i].f32()[e];
    }
  });
  cpu_device().set_deterministic_mode(false);
  SCOPED_TRACE("cp " + std::to_string(cp) + (llama ? " llama" : " gpt") + (deterministic ? " deterministic" : ""));
  EXPECT_NEAR(loss_sum, whole.loss, 1e-5 * std::abs(whole.loss));
  ASSERT_EQ(grad_sums.size(), whole.grads.size());
  for (const auto& [name, sum] : grad_sums) {
    const std::vector<float> got(sum.begin(), sum.end());
    EXPECT_LT(relative_error(got.data(), whole.grads.at(name)), 1e-5) << name;
  }
}

INSTANTIATE_TEST_SUITE_P(Layouts, ContextParallelModel,
                         testing::Combine(testing::Values(2, 4), testing::Values(false, true),
                                          testing::Values(false, true)));

// Pipeline chunks in one process: stage by stage, handing activations forward and their
// gradients back by hand, as the executor's p2p would. Untied, so the result is the whole
// model's to the bit (the same operations in the same order).
TEST(PipelineChunks, StageByStageEqualsTheWholeModelBitwise) {
  GPTConfig c = tiny();
  c.num_layers = 4;
  c.untie_embeddings_and_output_weights = true;
  const Whole whole = run_whole(c);
  for (int pp : {2, 4}) {
    std::vector<std::unique_ptr<GPTModel>> stages;
    PipelineSplit split;
    split.pp_size = pp;
    for (int r = 0; r < pp; ++r) {
      ModelPartition part;
      part.chunks = pipeline_chunks(c.num_layers, split, r);
      stages.push_back(std::make_unique<GPTModel>(c, cpu_device(), B, part, std::vector<int>{1},
                                                  std::vector<int>{1}, nullptr));
      stages.back()->init_weights();
      stages.back()->zero_grads();
    }
    Batch batch = make_batch(c);
    double sums[2] = {0.0, 0.0};  // only the last stage adds its loss
    for (int r = 0; r < pp; ++r) {
      if (r > 0) {
        const Tensor from = stages[r - 1]->chunk_output(0, 0), to = stages[r]->chunk_input(0, 0);
        std::memcpy(to.host<void>(), from.host<void>(), from.bytes());
      }
      stages[r]->forward(0, {}, batch.view(), kStep, Tensor(sums, DType::I64, {2}, &cpu_device()));
    }
    EXPECT_EQ(sums[0], whole.loss) << "pp " << pp;
    for (int r = pp - 1; r >= 0; --r) {
      if (r < pp - 1) {
        const Tensor from = stages[r + 1]->chunk_input_grad(0, 0), to = stages[r]->chunk_output_grad(0, 0);
        std::memcpy(to.host<void>(), from.host<void>(), from.bytes());
      }
      stages[r]->backward(0, {}, batch.view(), kStep, 0.1f);
    }
    size_t seen = 0;
    for (auto& stage : stages)
      for (size_t i = 0; i < stage->shards().size(); ++i, ++seen) {
        const std::vector<float>& want = whole.grads.at(stage->shards()[i].spec.name);
        EXPECT_EQ(0, std::memcmp(stage->grads()[i].host<void>(), want.data(), want.size() * sizeof(float)))
            << "pp " << pp << " " << stage->shards()[i].spec.name;
      }
    EXPECT_EQ(seen, whole.grads.size());
  }
}

TEST(PipelineChunks, LayerSplitsFollowMegatron) {
  PipelineSplit even{4, 1, -1, -1};
  EXPECT_EQ(pipeline_chunks(8, even, 1)[0].first_layer, 2);
  EXPECT_TRUE(pipeline_chunks(8, even, 0)[0].has_embedding);
  EXPECT_TRUE(pipeline_chunks(8, even, 3)[0].has_head);
  PipelineSplit uneven{3, 1, 1, 3};  // 1 + (8-1-3) + 3
  EXPECT_EQ(pipeline_chunks(8, uneven, 1)[0].first_layer, 1);
  EXPECT_EQ(pipeline_chunks(8, uneven, 1)[0].end_layer, 5);
  EXPECT_EQ(pipeline_chunks(8, uneven, 2)[0].end_layer, 8);
  PipelineSplit interleaved{4, 2, -1, -1};  // virtual stage = chunk*4 + rank, one layer each
  auto chunks = pipeline_chunks(8, interleaved, 1);
  ASSERT_EQ(chunks.size(), 2u);
  EXPECT_EQ(chunks[0].first_layer, 1);
  EXPECT_EQ(chunks[1].first_layer, 5);
  EXPECT_TRUE(pipeline_chunks(8, interleaved, 3)[1].has_head);
  EXPECT_FALSE(pipeline_chunks(8, interleaved, 3)[0].has_head);
  EXPECT_THROW(pipeline_chunks(9, even, 0), Error);
  EXPECT_THROW(pipeline_chunks(8, PipelineSplit{4, 1, 2, 3}, 0), Error);  // 3 layers over 2 middle stages
}

}  // namespace
}  // namespace tessera
