// Megatron-LM's default checkpoint format, `--ckpt-format torch_dist` (megatron-core 0.10.0's
// dist_checkpointing over PyTorch Distributed Checkpoint), read by tessera:
//
//   DIR/latest_checkpointed_iteration.txt
//   DIR/iter_0000100/metadata.json   {"sharded_backend": "torch_dist", "sharded_backend_version": 1,
//                                      "common_backend": "torch", "common_backend_version": 1}
//                                     (megatron/core/dist_checkpointing/core.py)
//   DIR/iter_0000100/common.pt       torch.save of what is not sharded: args, checkpoint_version,
//                                     iteration, optimizer {state: {common_step}, param_groups},
//                                     opt_param_scheduler, num_floating_point_operations_so_far
//   DIR/iter_0000100/.metadata       pickled torch.distributed.checkpoint Metadata: each global key
//                                     -> TensorStorageMetadata(properties, size, chunks [offsets,
//                                     sizes]) or BytesStorageMetadata; (key, chunk offsets) ->
//                                     _StorageInfo(relative_path, offset, length)
//   DIR/iter_0000100/__R_I.distcp    rank R's data: one torch.save payload per chunk, at byte offsets
//
// Keys are global and independent of TP/PP (megatron/core/dist_checkpointing/strategies/torch.py
// sharded_tensor_to_torch_sharded_tensor): a layer's parameters are stacked on a leading axis
// (`decoder.layers.self_attention.linear_qkv.weight` is [L, rows, H], one chunk per layer and TP
// rank), the norms under Transformer Engine's spelling even for the local spec
// (`...linear_qkv.layer_norm_weight`), SwiGLU's fc1 as [W of every rank; V of every rank]
// (megatron/core/transformer/mlp.py apply_swiglu_sharded_factory), `_extra_state/shard_*` byte
// objects (skipped), and the plain optimizer's moments as `optimizer.state.{exp_avg,exp_avg_sq}.
// <key>` sharded like their parameter (`fp32_param` the fp32 main parameters of a 16-bit run;
// megatron/core/optimizer/optimizer.py sharded_state_dict).
//
// Reading executes nothing: .metadata goes through the restricted pickle reader's
// DcpMetadata allow-list (pickle.h), every file name, offset, length, chunk extent and payload
// tensor is checked before use, and the .distcp files are memory-mapped and read one chunk at a
// time (its pages dropped after), so a checkpoint is never read whole into memory. Each chunk
// becomes a piece of tessera's parameter, placed along the dimension it is split on, and is
// resharded into any TP/PP layout by checkpoint.h's planning.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "tessera/ckpt/checkpoint.h"
#include "tessera/ckpt/dcp_metadata.h"
#include "tessera/ckpt/megatron_checkpoint.h"
#include "tessera/ckpt/zip_archive.h"

namespace tessera {

// Whether DIR/iter_N's metadata.json names a sharded backend (Megatron's dist_checkpointing);
// one other than torch_dist (zarr) is an Error naming it.
bool is_torch_dist_checkpoint(const std::string& dir, int64_t iteration);

// The training state common.pt records (as read_megatron_metadata: iteration, consumed samples,
// scheduler, Adam's step, the layout from args), without reading a tensor of the .distcp files.
CheckpointState read_torch_dist_metadata(const std::string& dir, int64_t iteration);

// load_checkpoint_pieces (checkpoint.h) for torch_dist: fills this rank's slices from the
// chunks of any saved layout; the optimizer's moments only when load_optimizer.
CheckpointState load_torch_dist_checkpoint(const std::string& dir, int64_t iteration,
                                           const std::vector<FlatPiece>& model,
                                           const std::vector<FlatPiece>& optimizer, bool load_optimizer,
                                           int tp_rank, int tp_size);

// A (tp, pp) rank of a layout.
struct TorchDistRank {
  int tp_rank = 0, tp_size = 1, pp_rank = 0, pp_size = 1;
};
// "<name>/shard_<pp>.<tp>_<PP>.<TP>": the key of the rank's ShardedObject `name` of a (PP, TP)
// grid (rng_state: megatron/training/checkpointing.py get_rng_state; rerun_state_machine_state:
// megatron/core/rerun_state_machine.py state_dict; megatron/core/dist_checkpointing/mapping.py
// unique_key).
std::string torch_dist_rank_object_key(const std::string& name, const TorchDistRank& rank);
// The rank's rng_state object of a checkpoint saved at its TP/PP (Megatron loads it only
// there): the torch.save payload, checked to be Megatron's list of generator-state dicts (an
// Error naming it otherwise); nullopt when the checkpoint holds none for the rank. tessera draws
// nothing from these generators, so a resume keeps the payload and saves it again unchanged:
// a Megatron run handed back gets its generators as it left them.
std::optional<std::vector<uint8_t>> read_torch_dist_rng_state(const std::string& dir, int64_t iteration,
                                                              const TorchDistRank& rank);

// What `tessera ckpt inspect` shows: each tensor key, dtype, global shape and chunk count, every
// chunk's payload checked (extent, CRC-32, dtype and shape against .metadata).
std::vector<std::string> summarize_torch_dist_checkpoint(const std::string& dir, int64_t iteration);

// ---- Writing (--ckpt-format torch_dist) -----------------------------------------------------
// What Megatron's GPTModel.sharded_state_dict() and its plain optimizer's sharded_state_dict()
// give one rank, written as megatron-core's dist_checkpointing.save writes it: every rank its own
// .distcp, the coordinator .metadata, common.pt and metadata.json.

// One rank's tensors, under tessera's names and slices (ShardedTensor placement), the tied
// output layer's copy left out. Data-parallel rank 0 of each (tp, pp) writes the model, its
// _extra_state and rng_state objects and the plain optimizer's state; with the distributed
// optimizer every data-parallel rank writes its own ranges (flat_state).
struct TorchDistShard {
  std::vector<ShardedTensor> params;  // the model's tensors, saved in their dtype
  std::vector<ShardedTensor> main;    // a 16-bit run's F32 main parameters: optimizer.state.fp32_param
  std::vector<ShardedTensor> state;   // "<kind>.<name>" (exp_avg, exp_avg_sq): optimizer.state.<kind>
  // The distributed optimizer's ranges, "<kind>.<name>" (exp_avg, exp_avg_sq, fp32_param), in
  // Megatron's default layout for it, fully_sharded_model_space (dcp_metadata.h): each range of
  // an N-D parameter's block as a chunk of the reformulated tensor.
  std::vector<FlatPiece> flat_state;
  int tp_rank = 0, tp_size = 1;       // replicated tensors are written by TP rank 0 (the main replica)
  int pp_rank = 0, pp_size = 1;
  int num_layers = 0;                 // the model's, the stacked axis's length
  int num_experts = 0;                // the experts' axis's length
  // Keys number the layers ("decoder.layers.3.mlp...") instead of stacking them: megatron-core's
  // non_homogeneous_layers, which a --moe-layer-freq other than 1 implies
  // (torch_dist_numbered_layers).
  bool numbered_layers = false;
  bool swiglu = false;
  // Transformer Engine's layer spec (megatron_layer_spec.h: megatron_uses_transformer_engine of
  // the saved Namespace): its modules' _extra_state objects, and the norm of an MoE layer (one of
  // moe_layers: per global layer, MoEConfig's) keyed as its own pre_mlp_layernorm, not fused
  // into linear_fc1.
  bool transformer_engine = false;
  std::vector<bool> moe_layers;
  // Write the payloads of this rank's rng_state and rerun_state_machine_state objects (none when
  // empty). Megatron's load asks for both at the saved TP/PP.
  std::function<void(const zip::StoredWriter::Append&)> rng_state, rerun_state;
};

// Whether megatron-core numbers the layers in torch_dist keys for a model whose Namespace
// `args` has this moe_layer_freq (megatron/core/transformer/transformer_block.py
// sharded_state_dict: an int above 1, or a list).
bool torch_dist_numbered_layers(const nlohmann::json& args);

// Writes (and fsyncs) TMP/__<rank>_0.distcp, one torch.save payload per chunk, one tensor's bytes
// in memory at a time; returns the storage records for write_torch_dist_index.
nlohmann::json write_torch_dist_shard(const std::string& tmp_dir, int rank, const TorchDistShard& shard);

// The coordinator, after every rank's shard: TMP/.metadata from every rank's records, common.pt
// (write_torch_dist_common) and Megatron's metadata.json, each fsynced.
void write_torch_dist_index(const std::string& tmp_dir, const std::vector<nlohmann::json>& records,
                            const MegatronFileSpec& spec, const std::vector<bool>& group_weight_decay);

}  // namespace tessera
