#include "tessera/model/model_partition.h"

#include <cstring>

#include "tessera/core/error.h"

namespace tessera {

ModelPartition ModelPartition::whole(const GPTConfig& config) {
  ModelPartition p;
  p.chunks.push_back({0, config.num_layers, true, true});
  return p;
}

ModelPartition::ExpertRange ModelPartition::local_experts(int num_experts) const {
  if (ep_size < 1 || num_experts % ep_size != 0)
    throw usage_error("--num-experts " + std::to_string(num_experts) + " is not divisible by "
                      "--expert-model-parallel-size " + std::to_string(ep_size),
                      "every expert-parallel rank holds the same number of experts: choose an expert-parallel size "
                      "that divides the number of experts");
  const int per = num_experts / ep_size;
  return {ep_rank * per, per};
}

int expert_index_of(const std::string& name) {
  static const std::string kExperts = "mlp.experts.local_experts.";
  const size_t at = name.find(kExperts);
  if (at == std::string::npos) return -1;
  return std::stoi(name.substr(at + kExperts.size()));
}

std::vector<ModelChunk> pipeline_chunks(int num_layers, const PipelineSplit& split, int pp_rank) {
  const int PP = split.pp_size, V = split.virtual_stages;
  const bool uneven = split.first_stage_layers >= 0 || split.last_stage_layers >= 0;
  std::vector<ModelChunk> chunks;
  if (V > 1) {
    if (uneven)
      throw usage_error("--decoder-first-pipeline-num-layers / --decoder-last-pipeline-num-layers with "
                        "--num-layers-per-virtual-pipeline-stage is not supported yet");
    if (num_layers % (PP * V) != 0)
      throw usage_error("--num-layers " + std::to_string(num_layers) + " is not divisible by " +
                        std::to_string(PP * V) + " (--pipeline-model-parallel-size " + std::to_string(PP) + " x " +
                        std::to_string(V) + " virtual stages)");
    const int per = num_layers / (PP * V);
    for (int c = 0; c < V; ++c) {
      const int stage = c * PP + pp_rank;
      chunks.push_back({stage * per, (stage + 1) * per, stage == 0, stage == PP * V - 1});
    }
    return chunks;
  }
  // Layers per rank: first and last as configured, the rest even over the middle ranks.
  std::vector<int> counts(PP, 0);
  if (!uneven) {
    if (num_layers % PP != 0)
      throw usage_error("--num-layers " + std::to_string(num_layers) + " is not divisible by "
                        "--pipeline-model-parallel-size " + std::to_string(PP),
                        "choose a multiple, or set --decoder-first-pipeline-num-layers / "
                        "--decoder-last-pipeline-num-layers for an uneven split");
    counts.assign(PP, num_layers / PP);
  } else {
    if (PP == 1) throw usage_error("--decoder-first/last-pipeline-num-layers need --pipeline-model-parallel-size > 1");
    int rest = num_layers, middle = PP;
    if (split.first_stage_layers >= 0) counts[0] = split.first_stage_layers, rest -= counts[0], --middle;
    if (split.last_stage_layers >= 0) counts[PP - 1] = split.last_stage_layers, rest -= counts[PP - 1], --middle;
    if (rest < 0 || (middle == 0 ? rest != 0 : rest % middle != 0))
      throw usage_error("--num-layers " + std::to_string(num_layers) + " minus --decoder-first/last-pipeline-num-layers "
                        "leaves " + std::to_string(rest) + " layers, which do not divide evenly over the " +
                        std::to_string(middle) + " other pipeline stages");
    for (int r = 0; r < PP; ++r)
      if ((r > 0 || split.first_stage_layers < 0) && (r < PP - 1 || split.last_stage_layers < 0))
        counts[r] = rest / middle;
  }
  int first = 0;
  for (int r = 0; r < pp_rank; ++r) first += counts[r];
  chunks.push_back({first, first + counts[pp_rank], pp_rank == 0, pp_rank == PP - 1});
  return chunks;
}

ParamShard::Blocks ParamShard::blocks() const {
  if (split_dim < 0) return {numel(), 1, 0, numel()};
  int64_t inner = 1;
  for (size_t d = static_cast<size_t>(split_dim) + 1; d < shape.size(); ++d) inner *= shape[d];
  const int64_t block = shape[split_dim] * inner;
  return {block, numel() / block, offset * inner, spec.shape[split_dim] * inner};
}

int64_t ParamShard::full_index(int64_t e) const {
  const Blocks b = blocks();
  return b.first + (e / b.block) * b.full_stride + e % b.block;
}

void extract_shard(float* local, const float* full, const ParamShard& shard) {
  const ParamShard::Blocks b = shard.blocks();
  for (int64_t k = 0; k < b.count; ++k)
    std::memcpy(local + k * b.block, full + b.first + k * b.full_stride, static_cast<size_t>(b.block) * sizeof(float));
}

namespace {

// Megatron's parallel layer for each parameter: the dimension TP splits (-1: replicated).
int split_dim_of(const std::string& name, bool swiglu) {
  auto ends = [&](const char* s) { return name.ends_with(s); };
  if (ends("word_embeddings.weight") || ends("output_layer.weight")) return 0;  // vocabulary
  if (name.find("linear_qkv.") != std::string::npos) return 0;
  // SwiGLU's [2, F, H] (bias [2, F]) splits F: rank r holds [gate_r; up_r] as Megatron does.
  if (name.find("linear_fc1.") != std::string::npos) return swiglu ? 1 : 0;
  if (ends("linear_proj.weight") || ends("linear_fc2.weight")) return 1;
  return -1;
}

void check_divisible(int64_t n, int tp, const std::string& what) {
  if (n % tp != 0)
    throw usage_error(what + " (" + std::to_string(n) + ") is not divisible by --tensor-model-parallel-size " +
                      std::to_string(tp));
}

}  // namespace

std::vector<ParamShard> shard_params(const GPTConfig& config, const ModelPartition& partition) {
  const int tp = partition.tp_size;
  check_divisible(config.num_attention_heads, tp, "--num-attention-heads");
  // linear_qkv's rows are grouped by query group (Megatron's layout): a rank holds whole groups.
  check_divisible(config.query_groups(), tp, "--num-query-groups");
  check_divisible(config.ffn_hidden_size, tp, "--ffn-hidden-size");
  check_divisible(config.padded_vocab_size, tp, "the padded vocabulary size");
  const std::vector<ParamSpec> specs = gpt_param_specs(config);
  bool rank_has_embedding = false;
  for (const ModelChunk& c : partition.chunks) rank_has_embedding |= c.has_embedding;
  const bool tied = !config.untie_embeddings_and_output_weights;
  const ModelPartition::ExpertRange experts =
      config.moe.enabled() ? partition.local_experts(config.moe.num_experts) : ModelPartition::ExpertRange{};

  auto make = [&](const ParamSpec& spec) {
    ParamShard s;
    s.spec = spec;
    s.shape = spec.shape;
    s.split_dim = split_dim_of(spec.name, config.swiglu);
    s.is_expert = expert_index_of(spec.name) >= 0;
    if (s.split_dim >= 0) {
      s.shape[s.split_dim] /= tp;
      s.offset = s.shape[s.split_dim] * partition.tp_rank;
    } else {
      s.counts_in_norm = partition.tp_rank == 0;
      // Replicated parameters that act on sequence-split activations: LayerNorms and the
      // biases added after a row-parallel linear's reduce-scatter. Not the MoE router and the
      // shared experts' gate: every TP rank computes them on the whole sequence (moe_layer.h).
      const bool whole_sequence = spec.name.ends_with("mlp.router.weight") || spec.name.ends_with("gate_weight");
      s.grad_sums_over_tp = partition.sequence_parallel && spec.name.find("position_embeddings") == std::string::npos &&
                            !whole_sequence;
    }
    return s;
  };
  auto layer_of = [](const std::string& name) {
    return std::stoi(name.substr(std::strlen("decoder.layers.")));
  };
  std::vector<ParamShard> out;
  for (size_t c = 0; c < partition.chunks.size(); ++c) {
    const ModelChunk& chunk = partition.chunks[c];
    for (const ParamSpec& spec : specs) {
      const std::string& n = spec.name;
      bool mine;
      if (n.starts_with("embedding.")) mine = chunk.has_embedding;
      else if (n.starts_with("decoder.layers.")) mine = layer_of(n) >= chunk.first_layer && layer_of(n) < chunk.end_layer;
      else mine = chunk.has_head;  // final LayerNorm, untied output layer
      const int expert = expert_index_of(n);
      if (expert >= 0 && !experts.contains(expert)) mine = false;  // another EP rank's expert
      if (mine) {
        out.push_back(make(spec));
        out.back().chunk = static_cast<int>(c);
      }
    }
    if (chunk.has_head && tied && !rank_has_embedding) {
      // The output layer of a tied model on a stage without the embedding: a copy of the word
      // embedding, initialised alike (same parameter id) and kept equal by summing gradients.
      ParamShard copy = make(specs.front());
      copy.is_embedding_copy = true;
      copy.counts_in_norm = false;
      copy.chunk = static_cast<int>(c);
      out.push_back(copy);
    }
  }
  return out;
}

}  // namespace tessera
