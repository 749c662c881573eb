// Megatron's gradient-buffer layout: the worked example of the distributed optimizer's
// ranges (H=24, padded vocabulary 128, swiglu F=64, one layer, tied embeddings, DP=4), as
// Megatron's _ParamAndGradBuffer and _build_model_gbuf_param_range_map compute it.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "tessera/parallel/grad_buffer_layout.h"

using namespace tessera;

namespace {

// Registration order (named_parameters()); the buffer holds them reversed.
const std::vector<std::string> kNames = {"word_embeddings", "input_layernorm", "linear_proj", "linear_qkv",
                                         "pre_mlp_layernorm", "linear_fc1", "linear_fc2", "final_layernorm"};
const std::vector<int64_t> kNumels = {128 * 24, 24, 24 * 24, 72 * 24, 24, 128 * 24, 24 * 64, 24};

size_t index_of(const std::string& name) {
  return static_cast<size_t>(std::find(kNames.begin(), kNames.end(), name) - kNames.begin());
}

GradBufferLayout distributed(int dp, int64_t bucket_size = INT64_MAX) {
  GradBufferOptions o;
  o.data_parallel = dp;
  o.distributed_optimizer = true;
  o.bucket_size = bucket_size;
  return build_grad_buffer_layout(kNumels, o);
}

// The local slice [begin, end) of parameter `name` that rank r owns, or {0, 0}.
std::pair<int64_t, int64_t> owned_slice(const GradBufferLayout& l, const std::string& name, int r) {
  const GradBufferLayout::Param& p = l.params[index_of(name)];
  const int64_t lo = std::max(p.start, l.owned_begin(p.bucket, r));
  const int64_t hi = std::min(p.start + p.numel, l.owned_end(p.bucket, r));
  if (lo >= hi) return {0, 0};
  return {lo - p.start, hi - p.start};
}

}  // namespace

TEST(GradBufferLayout, MegatronWorkedExampleRanges) {
  const GradBufferLayout l = distributed(4);
  ASSERT_EQ(l.buckets.size(), 1u);
  EXPECT_EQ(l.numel, 10240);
  EXPECT_EQ(l.buckets[0].numel_unpadded, 10176);
  const std::vector<std::pair<std::string, int64_t>> starts = {
      {"final_layernorm", 0},   {"linear_fc2", 64},       {"linear_fc1", 1600},      {"pre_mlp_layernorm", 4672},
      {"linear_qkv", 4736},     {"linear_proj", 6464},    {"input_layernorm", 7040}, {"word_embeddings", 7104}};
  for (const auto& [name, start] : starts) EXPECT_EQ(l.params[index_of(name)].start, start) << name;
  using Slice = std::pair<int64_t, int64_t>;
  EXPECT_EQ(owned_slice(l, "final_layernorm", 0), Slice(0, 24));
  EXPECT_EQ(owned_slice(l, "linear_fc2", 0), Slice(0, 1536));
  EXPECT_EQ(owned_slice(l, "linear_fc1", 0), Slice(0, 960));
  EXPECT_EQ(owned_slice(l, "linear_fc1", 1), Slice(960, 3072));
  EXPECT_EQ(owned_slice(l, "pre_mlp_layernorm", 1), Slice(0, 24));
  EXPECT_EQ(owned_slice(l, "linear_qkv", 1), Slice(0, 384));
  EXPECT_EQ(owned_slice(l, "linear_qkv", 2), Slice(384, 1728));
  EXPECT_EQ(owned_slice(l, "linear_proj", 2), Slice(0, 576));
  EXPECT_EQ(owned_slice(l, "input_layernorm", 2), Slice(0, 24));
  EXPECT_EQ(owned_slice(l, "word_embeddings", 2), Slice(0, 576));
  EXPECT_EQ(owned_slice(l, "word_embeddings", 3), Slice(576, 3072));
  EXPECT_EQ(owned_slice(l, "linear_fc1", 2), Slice(0, 0));
}

TEST(GradBufferLayout, OnlyTheEndPaddingDependsOnDataParallelSize) {
  EXPECT_EQ(distributed(3).numel, 10368);  // lcm(3, 128) = 384
  EXPECT_EQ(distributed(8).numel, 10240);
  EXPECT_EQ(distributed(3).buckets[0].numel_unpadded, 10176);
  EXPECT_EQ(distributed(1).numel, 10240);  // DP=1: one owner of everything
}

TEST(GradBufferLayout, WithoutTheDistributedOptimizerPacksDensely) {
  GradBufferOptions o;
  o.dense_alignment = 1;  // Megatron's dense packing
  EXPECT_EQ(build_grad_buffer_layout(kNumels, o).numel, 10056);
}

TEST(GradBufferLayout, BucketsCloseAfterTheParameterThatFillsThem) {
  // Bucket 0 closes after fc1 at 4672 (padded to 4736); pre_mlp_layernorm opens bucket 1 at
  // 4736, which moves every later parameter by 64: the word embedding ends at 10240.
  const GradBufferLayout l = distributed(4, 3000);
  ASSERT_EQ(l.buckets.size(), 2u);
  EXPECT_EQ(l.buckets[0].start, 0);
  EXPECT_EQ(l.buckets[0].end, 4736);
  EXPECT_EQ(l.buckets[0].numel_unpadded, 4672);
  EXPECT_EQ(l.buckets[1].start, 4736);
  EXPECT_EQ(l.buckets[1].end, 10240);
  EXPECT_EQ(l.buckets[1].numel_unpadded, 5504);
  EXPECT_EQ(l.params[index_of("pre_mlp_layernorm")].start, 4736);
  EXPECT_EQ(l.params[index_of("word_embeddings")].start, 7168);
  // Bucket 0 holds the last-registered parameters: fc1, fc2 and the final LayerNorm.
  EXPECT_EQ(l.buckets[0].first_param, index_of("linear_fc1"));
  EXPECT_EQ(l.buckets[0].end_param, kNames.size());
  EXPECT_EQ(l.buckets[1].first_param, 0u);
  EXPECT_EQ(l.buckets[1].end_param, index_of("linear_fc1"));
  EXPECT_EQ(l.params[index_of("linear_qkv")].bucket, 1u);
}

TEST(GradBufferLayout, SharedEmbeddingGetsABucketOfItsOwn) {
  GradBufferOptions o;
  o.data_parallel = 2;
  o.distributed_optimizer = true;
  std::vector<bool> own(kNumels.size(), false);
  own[index_of("word_embeddings")] = true;
  const GradBufferLayout l = build_grad_buffer_layout(kNumels, o, own);
  ASSERT_EQ(l.buckets.size(), 2u);
  EXPECT_EQ(l.buckets[0].end_param - l.buckets[0].first_param, kNumels.size() - 1);
  EXPECT_EQ(l.buckets[1].first_param, index_of("word_embeddings"));
  EXPECT_EQ(l.buckets[1].end_param, index_of("word_embeddings") + 1);
  EXPECT_EQ(l.buckets[1].start % 128, 0);
  EXPECT_EQ(l.params[index_of("word_embeddings")].start, l.buckets[1].start);
}

// Two model chunks (the interleaved schedule), each the worked example's parameters. Megatron
// gives each chunk a buffer of its own and splits only the first chunk's into buckets
// (distributed_data_parallel.py: bucket_size None for chunks other than the first), so the
// second chunk, which the reversed order places first, is one bucket laid out as the unsplit
// example, and the first chunk follows it, split as the 3000-element example.
TEST(GradBufferLayout, OnlyTheFirstModelChunkIsSplitIntoBuckets) {
  std::vector<int64_t> numels = kNumels;
  numels.insert(numels.end(), kNumels.begin(), kNumels.end());
  std::vector<int> chunks(kNumels.size(), 0);
  chunks.resize(numels.size(), 1);
  GradBufferOptions o;
  o.data_parallel = 4;
  o.distributed_optimizer = true;
  o.bucket_size = 3000;
  const GradBufferLayout l = build_grad_buffer_layout(numels, o, {}, chunks);
  const GradBufferLayout whole = distributed(4), split = distributed(4, 3000);
  ASSERT_EQ(l.buckets.size(), 3u);
  EXPECT_EQ(l.buckets[0].start, 0);
  EXPECT_EQ(l.buckets[0].end, 10240);
  EXPECT_EQ(l.buckets[0].numel_unpadded, 10176);
  EXPECT_EQ(l.buckets[0].first_param, kNumels.size());
  EXPECT_EQ(l.buckets[0].end_param, numels.size());
  for (size_t b = 0; b < 2; ++b) {
    EXPECT_EQ(l.buckets[1 + b].start, 10240 + split.buckets[b].start);
    EXPECT_EQ(l.buckets[1 + b].end, 10240 + split.buckets[b].end);
    EXPECT_EQ(l.buckets[1 + b].numel_unpadded, split.buckets[b].numel_unpadded);
  }
  for (size_t i = 0; i < kNumels.size(); ++i) {
    EXPECT_EQ(l.params[kNumels.size() + i].start, whole.params[i].start) << kNames[i];
    EXPECT_EQ(l.params[i].start, 10240 + split.params[i].start) << kNames[i];
    EXPECT_EQ(l.params[i].bucket, 1 + split.params[i].bucket) << kNames[i];
  }
  // Without overlap (no bucket size), still one bucket per chunk: no bucket spans two chunks.
  o.bucket_size = INT64_MAX;
  o.distributed_optimizer = false;
  const GradBufferLayout dense = build_grad_buffer_layout(numels, o, {}, chunks);
  ASSERT_EQ(dense.buckets.size(), 2u);
  EXPECT_EQ(dense.buckets[0].first_param, kNumels.size());
  EXPECT_EQ(dense.buckets[1].end_param, kNumels.size());
}

// Expert parallelism: the experts' parameters get buffers of their own after the others
// (Megatron's expert_parallel_buffers), laid out by the same rules, with the distributed
// optimizer padded for the expert data-parallel size; the others are laid out as without them.
TEST(GradBufferLayout, ExpertsGetBucketsOfTheirOwnAfterTheOthers) {
  // Parameters 2 and 5 (linear_proj, word-embedding-sized) play the experts.
  std::vector<bool> expert(kNumels.size(), false);
  expert[2] = expert[5] = true;
  GradBufferOptions o;
  o.data_parallel = 4;
  o.expert_data_parallel = 3;
  o.distributed_optimizer = true;
  const GradBufferLayout l = build_grad_buffer_layout(kNumels, o, {}, {}, expert);
  std::vector<int64_t> dense_numels;
  for (size_t i = 0; i < kNumels.size(); ++i)
    if (!expert[i]) dense_numels.push_back(kNumels[i]);
  GradBufferOptions dense_o = o;
  const GradBufferLayout dense = build_grad_buffer_layout(dense_numels, dense_o);
  ASSERT_EQ(l.buckets.size(), 2u);
  EXPECT_FALSE(l.buckets[0].expert);
  EXPECT_TRUE(l.buckets[1].expert);
  EXPECT_EQ(l.buckets[0].end, dense.buckets[0].end);
  EXPECT_EQ(l.group_size(0), 4);
  EXPECT_EQ(l.group_size(1), 3);
  // The experts' bucket: 128*24 (param 5) then 24*24 at the next multiple of 64, padded to lcm(3, 128).
  EXPECT_EQ(l.buckets[1].start, dense.buckets[0].end);
  EXPECT_EQ(l.params[5].start, l.buckets[1].start);
  EXPECT_EQ(l.params[2].start, l.buckets[1].start + 128 * 24);
  EXPECT_EQ(l.buckets[1].numel_unpadded, 128 * 24 + 24 * 24);
  EXPECT_EQ(l.buckets[1].numel() % 384, 0);
  EXPECT_EQ(l.buckets[1].first_param, 2u);
  EXPECT_EQ(l.buckets[1].end_param, 6u);
  EXPECT_EQ(l.owned_begin(1, 1), l.buckets[1].start + l.buckets[1].numel() / 3);
  size_t d = 0;
  for (size_t i = 0; i < kNumels.size(); ++i)
    if (!expert[i]) {
      EXPECT_EQ(l.params[i].start, dense.params[d++].start) << kNames[i];
      EXPECT_EQ(l.params[i].bucket, 0u);
    } else {
      EXPECT_EQ(l.params[i].bucket, 1u);
    }
}
