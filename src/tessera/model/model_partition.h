// How the GPT is cut across ranks: which layers each pipeline rank runs (in one or several
// model chunks, for the interleaved schedule), and which slice of each parameter a
// tensor-parallel rank holds. Values only: no tensors, no communication.
//
// Tensor-parallel slicing (Megatron's ColumnParallelLinear / RowParallelLinear /
// VocabParallelEmbedding) is always one contiguous, even split along one dimension:
//   dim 0 (rows): word embedding and output layer (vocabulary), linear_qkv (query groups:
//       with Megatron's grouped [q heads; k; v] row layout the rows of rank r are exactly its
//       groups), linear_fc1 and their biases;
//   dim 1: linear_proj and linear_fc2 weights (their inputs are split); SwiGLU's linear_fc1
//       [2, F, H] and its bias [2, F] (F is split: rank r holds [gate_r; up_r]);
//   none: LayerNorms, position embedding, the biases of the row-parallel linears.
// Expert parallelism (Megatron's --expert-model-parallel-size) splits the experts of every MoE
// layer: EP rank r holds experts [r·E/EP, (r+1)·E/EP) whole (each then TP-sliced as above).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "tessera/model/gpt_config.h"

namespace tessera {

// One model chunk: decoder layers [first_layer, end_layer) (global indices), plus the
// embedding when it is the first virtual stage and the final LayerNorm + output layer when
// it is the last.
struct ModelChunk {
  int first_layer = 0;
  int end_layer = 0;
  bool has_embedding = false;
  bool has_head = false;
};

struct ModelPartition {
  int tp_size = 1;
  int tp_rank = 0;
  bool sequence_parallel = false;  // activations between TP regions split along the sequence
  int cp_size = 1;                 // context parallelism: this rank holds cp_rows(S, cp_size, cp_rank)
  int cp_rank = 0;                 // of every micro-batch's sequence (model/context_parallel.h)
  int ep_size = 1;                 // expert parallelism: this rank holds local_experts() of each MoE layer
  int ep_rank = 0;
  std::vector<ModelChunk> chunks;  // this rank's chunks, in virtual-stage order

  // This rank's experts [first, first + count) of num_experts (E / EP each). Throws a usage
  // error naming --num-experts and --expert-model-parallel-size when EP does not divide E.
  struct ExpertRange {
    int first = 0, count = 0;
    bool contains(int e) const { return e >= first && e < first + count; }
  };
  ExpertRange local_experts(int num_experts) const;

  // One rank, one chunk holding everything.
  static ModelPartition whole(const GPTConfig& config);
};

// Layers of each pipeline rank's chunks, Megatron's rules:
//  - without virtual stages, --num-layers divided evenly over the pipeline ranks, or, with
//    --decoder-first/last-pipeline-num-layers, those on the first/last rank and the rest
//    divided evenly over the others;
//  - with V virtual stages per rank, virtual stage s = chunk·PP + rank holds layers
//    [s·L/(PP·V), (s+1)·L/(PP·V)).
// Throws a usage error naming the flags when the layers do not divide.
struct PipelineSplit {
  int pp_size = 1;
  int virtual_stages = 1;
  int first_stage_layers = -1;  // --decoder-first-pipeline-num-layers (-1: even split)
  int last_stage_layers = -1;   // --decoder-last-pipeline-num-layers
};
std::vector<ModelChunk> pipeline_chunks(int num_layers, const PipelineSplit& split, int pp_rank);

// This rank's piece of one parameter.
struct ParamShard {
  ParamSpec spec;           // the full parameter (name, full shape, init, id)
  Shape shape;              // the local slice
  int split_dim = -1;       // -1: the whole tensor on every TP rank
  int64_t offset = 0;       // where the slice starts along split_dim
  // Counted once in gradient norms: false for the copies a norm must skip (a TP-replicated
  // parameter on TP ranks other than 0, the tied embedding's copy on the last stage).
  bool counts_in_norm = true;
  // Under sequence parallelism every TP rank computes only its sequence slice's share of
  // this replicated parameter's gradient (LayerNorms, row-parallel biases), so the
  // gradients are summed over the TP group (Megatron's `sequence_parallel` attribute).
  bool grad_sums_over_tp = false;
  // The last pipeline stage's copy of the tied word embedding (output layer); its gradient
  // is summed with the first stage's over the embedding group.
  bool is_embedding_copy = false;
  // One of this rank's experts (an MoE layer's mlp.experts.*): under expert parallelism its
  // gradient is reduced over the expert data-parallel group, not dp-cp, and it counts in the
  // norm on every EP rank, since each EP rank holds different experts (Megatron's
  // `allreduce = False` parameters, megatron/core/transformer/moe/experts.py).
  bool is_expert = false;
  int chunk = 0;  // the index of this rank's model chunk that holds it (interleaved schedule)

  int64_t numel() const { return shape_numel(shape); }
  // The slice as `count` runs of `block` contiguous local elements; run k starts at element
  // first + k * full_stride of the full parameter (one run when split along dim 0 or whole).
  struct Blocks {
    int64_t block, count, first, full_stride;
  };
  Blocks blocks() const;
  // Flat index in the full parameter of local element e (keys the counter-based init, so
  // every layout draws the same full weights).
  int64_t full_index(int64_t e) const;
};

// The parameters this rank holds, chunk by chunk, in Megatron's registration order within
// each chunk; of the experts, only this EP rank's.
std::vector<ParamShard> shard_params(const GPTConfig& config, const ModelPartition& partition);

// Copies this rank's slice out of a full parameter (row-major, full_shape's element count).
void extract_shard(float* local, const float* full, const ParamShard& shard);

// The expert index of an MoE layer's expert parameter ("...mlp.experts.local_experts.<e>.*"),
// or -1 for any other parameter.
int expert_index_of(const std::string& param_name);

}  // namespace tessera
