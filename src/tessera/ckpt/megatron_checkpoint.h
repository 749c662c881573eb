// Megatron-LM's own checkpoints, `--ckpt-format torch` (megatron/training/checkpointing.py),
// read and written by tessera:
//
//   DIR/latest_checkpointed_iteration.txt
//   DIR/iter_0000100/mp_rank_TT[_PPP]/model_optim_rng.pt     one per (tp, pp) rank
//   DIR/iter_0000100/mp_rank_TT[_PPP]/distrib_optim.pt       --use-distributed-optimizer
//   DIR/iter_0000100/mp_rank_TT[_PPP]_EEE/model_optim_rng.pt one per (tp, pp, ep) rank when the
//                                                             expert-parallel size is above 1
//
// MoE layers (SequentialMLP) keep megatron-core's names, tessera's too: mlp.router.weight,
// mlp.experts.local_experts.X.linear_fc1/linear_fc2 (split over TP like the dense MLP's),
// mlp.shared_experts.*. The file of expert-parallel rank r numbers its experts from 0 (expert
// r*E/EP is local 0); reading renumbers them globally and takes the replicated parameters from
// EP rank 0's files. Grouped-GEMM experts (--moe-grouped-gemm: GroupedMLP's weight1/weight2,
// TEGroupedMLP's linear_fc1.weight<X>) are read as SequentialMLP's and written as the saved
// Namespace's transformer_impl builds them (megatron_grouped_experts.h). Each EP rank's optimizer
// state is Megatron's chained [dense, expert] pair (megatron_optimizer_state.h), in
// distrib_optim.pt too; the distributed optimizer's state of a GroupedMLP save is refused by name.
//
// model_optim_rng.pt is a PyTorch zip file (torch_file.h) whose pickle holds `args` (an
// argparse.Namespace), `checkpoint_version` 3.0, `iteration`, `model` (this rank's slices,
// the stage's layers numbered from 0), `optimizer`, `opt_param_scheduler`, `rng_state`.
//
// Reading accepts both state-dict families and maps them onto tessera's (= mcore's local)
// names, through one table of renames in megatron_checkpoint.cpp:
//   - mcore: `embedding.*`, `decoder.layers.N.*`, `decoder.final_layernorm.*`, `output_layer.*`;
//     Transformer Engine's fused norms (`linear_qkv.layer_norm_weight`, `linear_fc1.
//     layer_norm_bias`, ...) become `input_layernorm.*` / `pre_mlp_layernorm.*`;
//     `_extra_state` entries are skipped;
//   - legacy: `language_model.embedding.*`, `language_model.encoder.layers.N.{input_norm,
//     self_attention.query_key_value, self_attention.dense, post_attention_norm,
//     mlp.dense_h_to_4h, mlp.dense_4h_to_h}`, `language_model.encoder.final_norm`,
//     `language_model.output_layer`, `word_embeddings_for_head` (the tied copy).
// Each stage's layers are renumbered from the layers of the stages before it. Every saved
// TP/PP layout is resharded into the caller's through checkpoint.h's planning (the pieces
// of each file, placed by their TP rank along the parameter's split dimension). The tied
// output layer's copy is not read (the word embedding fills it, as for tessera's files).
// Optimizer state (megatron_optimizer_state.h: torch's, under Megatron's parameter groups,
// chained dense and expert optimizers at EP > 1) is mapped back onto parameters by group
// position; mixed precision's fp32_from_fp16_params are the fp32 parameters when the optimizer
// is loaded. The distributed optimizer's state is
// in distrib_optim.pt beside each file (megatron_distrib_optim.h): each parameter's range of
// its flat tensors, found from the saving rank's buffer layout, is read as a piece of that
// parameter, so it reshards like the rest (any TP/PP/DP, either optimizer), and its `param`
// gives the fp32 main parameters.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "tessera/ckpt/checkpoint.h"
#include "tessera/ckpt/zip_archive.h"
#include "tessera/core/tensor.h"
#include "tessera/optim/optimizer.h"

namespace tessera {

inline constexpr const char* kMegatronFile = "model_optim_rng.pt";

// The folder of a (tp, pp, ep) rank's files (megatron/training/checkpointing.py
// get_checkpoint_name, core_r0.10.0): checkpoint_shard_folder's "mp_rank_TT[_PPP]", then
// "_EEE" when the expert-parallel size is above 1.
std::string megatron_shard_folder(int tp_rank, int pp_rank, int pp_size, int ep_rank, int ep_size);

// Whether DIR/iter_N holds Megatron's files (mp_rank_*/model_optim_rng.pt, no metadata.json).
bool is_megatron_checkpoint(const std::string& dir, int64_t iteration);

// The training state one file of the checkpoint records (its first rank's), without tensors:
// iteration, consumed samples and layout from `args`, opt_param_scheduler (num_steps and the
// settings under Megatron's keys), Adam's step, the fp16 grad scaler, the padded vocabulary.
// `args` is the Namespace's attributes as JSON: a torch dtype is {"$global": "torch.bfloat16"},
// an enum member {"$enum": "megatron.core.enums.ModelType", "value": 1}.
CheckpointState read_megatron_metadata(const std::string& dir, int64_t iteration);

// The training state of a Megatron file's top-level dict (model_optim_rng.pt, or torch_dist's
// common.pt) with its `args` as JSON: as read_megatron_metadata, the layout from args alone.
class TorchFile;
CheckpointState megatron_training_state(const TorchFile& f);

// A Megatron state-dict key as (stage-local layer or -1, tessera's name: the part after
// "decoder.layers.N." for a layer, else the whole name); nullopt for _extra_state entries.
std::optional<std::pair<int, std::string>> map_megatron_name(const std::string& key);

// An Error when the state read from it_dir (either of Megatron's formats) records another
// iteration than the folder's name (a release checkpoint records any).
void check_megatron_iteration(const std::string& it_dir, const CheckpointState& s, int64_t iteration);

// load_checkpoint_pieces (checkpoint.h) for Megatron's files: fills this rank's slices (or
// pieces of them) from any saved TP/PP layout; the optimizer state only when load_optimizer
// (an Error when the checkpoint has none, or keeps it in distrib_optim.pt).
CheckpointState load_megatron_checkpoint(const std::string& dir, int64_t iteration,
                                         const std::vector<FlatPiece>& model,
                                         const std::vector<FlatPiece>& optimizer, bool load_optimizer,
                                         int tp_rank, int tp_size);

// What `tessera ckpt inspect` shows of one file; every model tensor's storage is checked
// (extent, CRC-32), so a damaged file is an Error naming it.
struct MegatronFileSummary {
  std::string rel;      // "mp_rank_00_001/model_optim_rng.pt"
  std::string names;    // "mcore", "mcore (Transformer Engine norms)", "legacy"
  std::string optimizer;  // what its optimizer state is
  double checkpoint_version = 0;
  int64_t iteration = 0;
  struct Entry {
    std::string key, storage_type;
    std::vector<int64_t> shape;
  };
  std::vector<Entry> model;
  std::vector<std::string> top_level_keys;
};
std::vector<MegatronFileSummary> summarize_megatron_checkpoint(const std::string& dir, int64_t iteration);

// ---- Writing --------------------------------------------------------------------------------

// One parameter of a (tp, pp) file, in Megatron's registration order.
struct MegatronParam {
  std::string name;  // Megatron's, this stage's layers numbered from 0
  Tensor value;      // F32: the (main) parameter
  bool weight_decay = true;
  // Adam's exp_avg and exp_avg_sq, or SGD's momentum_buffer (F32, shaped like value); empty
  // without optimizer state. With the distributed optimizer they go to distrib_optim.pt.
  std::vector<std::pair<std::string, Tensor>> state;
  int chunk = 0;  // the virtual pipeline chunk holding it: saved under `model<chunk>` when a
                  // rank has more than one, else under `model`
  // A local expert's under expert parallelism above 1 (Megatron's allreduce=False): its state
  // is the expert optimizer's (megatron_optimizer_state.h).
  bool expert_parallel = false;
};

struct MegatronFileSpec {
  nlohmann::json args;  // the Namespace's attributes (the convention of read_megatron_metadata)
  int64_t iteration = 0;
  DType model_dtype = DType::F32;  // BF16 / F16: the model tensors rounded, the F32 values as
                                   // fp32_from_fp16_params
  bool with_optimizer = false;     // optimizer and opt_param_scheduler
  // The distributed optimizer: `optimizer` holds only the parameter groups (without params,
  // with step) and the grad scaler; the tensors go to distrib_optim.pt.
  bool distributed_optimizer = false;
  DType grad_dtype = DType::F32;  // the distributed optimizer's gradient buffers (distrib_optim.pt's key)
  OptimizerConfig optimizer;
  double lr = 0, weight_decay = 0;  // the groups' current values (before multipliers)
  int64_t optimizer_steps = 0;
  nlohmann::json grad_scaler;  // null: none
  nlohmann::json scheduler;    // opt_param_scheduler's state_dict (Megatron's keys)
  bool last_stage = false;     // adds output_layer._extra_state
  bool with_rng = true;        // rng_state (megatron_rng_state.h); false with --no-save-rng
  int tp_rank = 0, pp_rank = 0;
  double floating_point_operations = 0;
};

// Writes (and fsyncs) the model_optim_rng.pt of one (tp, pp) rank at `path`, streaming: one
// tensor's host copy in memory at a time, not the whole file. Its names, parameter order and
// extra state are those of the layer spec spec.args' transformer_impl names, local or Transformer
// Engine's (megatron_layer_spec.h), the optimizer state in that order. With spec.args'
// moe_grouped_gemm the experts are saved as megatron-core's grouped module
// (megatron_grouped_experts.h); for GroupedMLP the file's expert tensors (and their optimizer
// state) are host copies made first.
void write_megatron_file(const std::string& path, const MegatronFileSpec& spec,
                         const std::vector<MegatronParam>& params);

// torch_dist's common.pt (megatron/training/checkpointing.py generate_state_dict with
// use_dist_ckpt, less what dist_checkpointing shards into the .distcp files): args,
// checkpoint_version, iteration, the optimizer's unsharded part (param_groups without params, in
// the order `group_weight_decay` gives, and state.common_step) and opt_param_scheduler unless
// !spec.with_optimizer, num_floating_point_operations_so_far. Written and fsynced at `path`.
// With spec.distributed_optimizer the optimizer's part is the distributed optimizer's
// state_dict with param_state_sharding_type 'fully_sharded_model_space' (distrib_optimizer.py
// sharded_state_dict), the layout torch_dist.h writes its ranges in.
void write_torch_dist_common(const std::string& path, const MegatronFileSpec& spec,
                             const std::vector<bool>& group_weight_decay);

// torch_dist's rng_state object of the (tp, pp) rank (a torch.save of Megatron's list of one
// dict of generator states, megatron_rng_state.h) with --seed `seed`, appended.
void append_megatron_rng_state_object(const zip::StoredWriter::Append& append, int64_t seed, int tp_rank,
                                      int pp_rank);
// torch_dist's rerun_state_machine_state object: Megatron's rerun state machine as its default
// --rerun-mode disabled leaves it at `iteration` (as model_optim_rng.pt's rerun_state_machine).
void append_megatron_rerun_state_object(const zip::StoredWriter::Append& append, int64_t iteration);

// "decoder.layers.7.mlp.linear_fc1.weight" on a stage starting at layer 6 ->
// "decoder.layers.1.mlp.linear_fc1.weight"; an expert's number less first_expert, the first
// expert of the file's expert-parallel rank ("mlp.experts.local_experts.5." -> ".1." when it
// is 4); other names unchanged.
std::string megatron_local_name(const std::string& name, int first_layer, int first_expert = 0);

// The shape Megatron saves a tessera tensor of parameter `name` in: SwiGLU's fc1 [2, F, H] as
// [2F, H] (bias [2, F] as [2F]); other shapes unchanged.
Shape megatron_saved_shape(const std::string& name, const Shape& shape);

// The expert number X of a layer's "mlp.experts.local_experts.X.*" parameter; -1 for others.
int megatron_expert_of(const std::string& name);

}  // namespace tessera
