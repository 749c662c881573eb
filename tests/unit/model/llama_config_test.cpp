// The Llama family's parameter list and its tensor-parallel shards: Megatron's names and
// shapes (megatron/core/models/gpt/gpt_layer_specs.py with RMSNorm, RoPE, SwiGLU and query
// groups), the grouped QKV split by whole groups, and SwiGLU's fc1 split as Megatron splits
// it (rank r holds [gate_r; up_r], megatron/core/transformer/mlp.py).
#include <gtest/gtest.h>

#include <numeric>
#include <string>
#include <vector>

#include "tessera/core/error.h"
#include "tessera/model/gpt_config.h"
#include "tessera/model/model_partition.h"
#include "tessera/train/arguments.h"
#include "tessera/train/throughput.h"
#include "tiny_gpt.h"

namespace tessera {
namespace {

// The shared tiny Llama (tiny_gpt.h) with a 12-wide SwiGLU, Megatron's default dropout and no
// tokenizer vocabulary.
GPTConfig tiny_llama() {
  GPTConfig c = testing_gpt::tiny_llama(2);
  c.ffn_hidden_size = 12;
  c.hidden_dropout = GPTConfig{}.hidden_dropout;
  c.attention_dropout = GPTConfig{}.attention_dropout;
  c.vocab_size = GPTConfig{}.vocab_size;
  return c;
}

ParamShard find(const std::vector<ParamShard>& shards, const std::string& name) {
  for (const ParamShard& s : shards)
    if (s.spec.name == name) return s;
  throw std::runtime_error("no " + name);
}

TEST(LlamaConfig, ParameterNamesAndShapesAreMegatrons) {
  std::vector<std::string> names;
  std::vector<Shape> shapes;
  for (const ParamSpec& p : gpt_param_specs(tiny_llama())) {
    if (p.name.starts_with("decoder.layers.1.")) continue;
    names.push_back(p.name);
    shapes.push_back(p.shape);
  }
  const std::vector<std::string> want = {
      "embedding.word_embeddings.weight",
      "decoder.layers.0.input_layernorm.weight",
      "decoder.layers.0.self_attention.linear_proj.weight",
      "decoder.layers.0.self_attention.linear_qkv.weight",
      "decoder.layers.0.pre_mlp_layernorm.weight",
      "decoder.layers.0.mlp.linear_fc1.weight",
      "decoder.layers.0.mlp.linear_fc2.weight",
      "decoder.final_layernorm.weight",
      "output_layer.weight"};
  EXPECT_EQ(names, want);
  // (np + 2 ng) hn rows of linear_qkv; SwiGLU's fc1 as [gate; up].
  const std::vector<Shape> want_shapes = {{32, 16}, {16}, {16, 16}, {(4 + 2 * 2) * 4, 16}, {16}, {2, 12, 16},
                                          {16, 12}, {16}, {32, 16}};
  EXPECT_EQ(shapes, want_shapes);

  GPTConfig qwen = tiny_llama();
  qwen.add_qkv_bias = true;  // Qwen2: linear_qkv keeps its bias without the others
  int biases = 0;
  for (const ParamSpec& p : gpt_param_specs(qwen))
    if (p.name.ends_with(".bias")) {
      EXPECT_TRUE(p.name.ends_with("linear_qkv.bias")) << p.name;
      EXPECT_FALSE(p.weight_decay);
      ++biases;
    }
  EXPECT_EQ(biases, 2);
}

TEST(LlamaConfig, RotaryDimFollowsRotaryPercent) {
  GPTConfig c = tiny_llama();
  EXPECT_EQ(c.rotary_dim(), 4);
  c.kv_channels = 64;
  c.rotary_percent = 0.5f;
  EXPECT_EQ(c.rotary_dim(), 32);
  c.position_embedding = PositionEmbedding::None;
  EXPECT_EQ(c.rotary_dim(), 0);
}

// Rank r's fc1 rows are gate rows [rF/T, (r+1)F/T) then up rows of the same range: element e
// of the local [2, F/T, H] is full element (e / (F/T*H)) * F*H + r*F/T*H + e % (F/T*H).
TEST(LlamaConfig, SwigluFc1ShardIsGateSliceThenUpSlice) {
  const GPTConfig c = tiny_llama();
  const int64_t F = c.ffn_hidden_size, H = c.hidden_size;
  std::vector<float> full(static_cast<size_t>(2 * F * H));
  std::iota(full.begin(), full.end(), 0.0f);
  for (int r = 0; r < 2; ++r) {
    ModelPartition part = ModelPartition::whole(c);
    part.tp_size = 2;
    part.tp_rank = r;
    const ParamShard s = find(shard_params(c, part), "decoder.layers.0.mlp.linear_fc1.weight");
    ASSERT_EQ(s.shape, (Shape{2, F / 2, H}));
    std::vector<float> local(static_cast<size_t>(s.numel()));
    extract_shard(local.data(), full.data(), s);
    for (int half = 0; half < 2; ++half)
      for (int64_t row = 0; row < F / 2; ++row)
        for (int64_t col = 0; col < H; ++col) {
          const int64_t e = (half * (F / 2) + row) * H + col;
          const int64_t want = (half * F + r * (F / 2) + row) * H + col;
          ASSERT_EQ(s.full_index(e), want);
          ASSERT_EQ(local[static_cast<size_t>(e)], static_cast<float>(want));
        }
  }
}

// Megatron's grouped layout puts each query group's rows together, so a rank's contiguous
// rows are exactly its groups: rank 1 of 2 holds group 1 (rows from (R+2)*hn on).
TEST(LlamaConfig, GroupedQkvSplitsByWholeGroups) {
  const GPTConfig c = tiny_llama();
  ModelPartition part = ModelPartition::whole(c);
  part.tp_size = 2;
  part.tp_rank = 1;
  const ParamShard s = find(shard_params(c, part), "decoder.layers.0.self_attention.linear_qkv.weight");
  EXPECT_EQ(s.shape, (Shape{16, 16}));
  EXPECT_EQ(s.full_index(0), 16 * 16);
  // Two query groups do not split over TP 4.
  part.tp_size = 4;
  part.tp_rank = 0;
  try {
    shard_params(c, part);
    FAIL() << "two query groups over TP 4 must be refused";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--num-query-groups (2) is not divisible by --tensor-model-parallel-size 4"),
              std::string::npos)
        << e.what();
  }
}

// Expert parallelism: EP rank r holds experts [r*E/EP, (r+1)*E/EP) of every MoE layer, marked
// is_expert and TP-sliced as the dense MLP; the router and everything else on every EP rank.
TEST(LlamaConfig, ExpertParallelRanksHoldTheirExperts) {
  GPTConfig c = tiny_llama();
  c.moe.num_experts = 4;
  c.moe.ffn_hidden_size = 8;
  c.moe.moe_layers = {true, false};
  ModelPartition part = ModelPartition::whole(c);
  part.ep_size = 2;
  part.tp_size = 2;
  for (int r = 0; r < 2; ++r) {
    part.ep_rank = r;
    part.tp_rank = 1;
    EXPECT_EQ(part.local_experts(4).first, 2 * r);
    EXPECT_EQ(part.local_experts(4).count, 2);
    std::vector<int> experts;
    int routers = 0;
    for (const ParamShard& s : shard_params(c, part)) {
      const int e = expert_index_of(s.spec.name);
      EXPECT_EQ(s.is_expert, e >= 0) << s.spec.name;
      if (e >= 0 && s.spec.name.ends_with("linear_fc1.weight")) {
        experts.push_back(e);
        EXPECT_EQ(s.shape, (Shape{2, 8 / 2, 16}));  // SwiGLU [2, F, H] with F split over TP
        EXPECT_TRUE(s.counts_in_norm);
      }
      routers += s.spec.name.ends_with("mlp.router.weight");
    }
    EXPECT_EQ(experts, (std::vector<int>{2 * r, 2 * r + 1}));
    EXPECT_EQ(routers, 1);
  }
  EXPECT_EQ(expert_index_of("decoder.layers.3.mlp.experts.local_experts.12.linear_fc2.weight"), 12);
  EXPECT_EQ(expert_index_of("decoder.layers.3.mlp.router.weight"), -1);
  part.ep_size = 3;
  try {
    shard_params(c, part);
    FAIL() << "4 experts over EP 3 must be refused";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--num-experts 4 is not divisible by --expert-model-parallel-size 3"),
              std::string::npos)
        << e.what();
    EXPECT_EQ(e.exit_code(), 2);
  }
}

// Megatron's num_floating_point_operations (megatron/training/training.py) with query groups
// and SwiGLU, by hand for the Llama-3-8B shape.
TEST(LlamaConfig, ThroughputFlopsUseQueryGroupsAndSwiglu) {
  TrainArgs a;
  GPTConfig& m = a.model;
  m.num_layers = 32;
  m.hidden_size = 4096;
  m.num_attention_heads = 32;
  m.num_query_groups = 8;
  m.kv_channels = 128;
  m.ffn_hidden_size = 14336;
  m.seq_length = 8192;
  m.padded_vocab_size = 128256;
  m.swiglu = true;
  const double B = 4, s = 8192, L = 32, H = 4096;
  const double attn = (1.0 + 8.0 / 32.0 + s / H) * 1.0;
  const double mlp = 14336.0 / H * 1.5;
  const double logit = 128256.0 / (2.0 * L * H);
  const double want = 12.0 * B * s * L * H * H * (attn + mlp + logit);
  EXPECT_DOUBLE_EQ(megatron_flops_per_iteration(a, 4), want);
  // Without groups and SwiGLU: GPT's (1 + 1 + s/H) and F/H.
  m.num_query_groups = 0;
  m.swiglu = false;
  const double gpt = 12.0 * B * s * L * H * H * ((2.0 + s / H) + 14336.0 / H + logit);
  EXPECT_DOUBLE_EQ(megatron_flops_per_iteration(a, 4), gpt);
}

// With experts, Megatron's formula counts the active MLPs: top-k of them (of --ffn-hidden-size)
// and the shared experts, each with SwiGLU's 1.5 (Mixtral 8x7B's shape: top-2 of 8).
TEST(LlamaConfig, ThroughputFlopsCountActiveExperts) {
  TrainArgs a;
  GPTConfig& m = a.model;
  m.num_layers = 32;
  m.hidden_size = 4096;
  m.num_attention_heads = 32;
  m.num_query_groups = 8;
  m.kv_channels = 128;
  m.ffn_hidden_size = 14336;
  m.seq_length = 4096;
  m.padded_vocab_size = 32000;
  m.swiglu = true;
  m.moe.num_experts = 8;
  m.moe.topk = 2;
  const double B = 4, s = 4096, L = 32, H = 4096;
  const double attn = (1.0 + 8.0 / 32.0 + s / H), logit = 32000.0 / (2.0 * L * H);
  EXPECT_DOUBLE_EQ(megatron_flops_per_iteration(a, 4), 12.0 * B * s * L * H * H * (attn + 2 * 14336.0 / H * 1.5 + logit));
  m.moe.shared_expert_size = 2048;
  EXPECT_DOUBLE_EQ(megatron_flops_per_iteration(a, 4),
                   12.0 * B * s * L * H * H * (attn + 2 * 14336.0 / H * 1.5 + 2048.0 / H * 1.5 + logit));
}

}  // namespace
}  // namespace tessera
