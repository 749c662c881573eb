// Checkpoints in a layout familiar to Megatron users (megatron/training/checkpointing.py's
// --ckpt-format torch folders), written by tessera:
//
//   DIR/latest_checkpointed_iteration.txt      the iteration, decimal, no newline
//   DIR/iter_0000100/metadata.json             iteration, consumed samples, scheduler,
//                                              optimizer step, the arguments used, the layout
//                                              (TP, PP, DP, virtual stages), the padded
//                                              vocabulary, and the SHA-256 of every file below
//   DIR/iter_0000100/mp_rank_01_000/model.safetensors      this (tp, pp) rank's parameters
//   DIR/iter_0000100/mp_rank_01_000/optimizer.safetensors  its Adam moments / SGD momentum
//   DIR/iter_0000100/mp_rank_01_000/optimizer_dp_002.safetensors   with the distributed
//                                              optimizer, instead: data-parallel rank 2's
//                                              owned ranges of the state (one file per rank)
//
// One folder per (tp, pp) rank: `mp_rank_{tp:02d}` when PP is 1, `mp_rank_{tp:02d}_{pp:03d}`
// otherwise. Parameters keep their global Megatron names ("decoder.layers.5.mlp.linear_fc1.
// weight", not renumbered per stage); optimizer state is "<kind>.<parameter name>"
// ("exp_avg.decoder.layers.5.mlp.linear_fc1.weight"), sharded as its parameter. Every tensor
// records in the safetensors metadata its global shape, the dimension it is split along
// (-1: whole) and its offset there, so any layout can find its slice: loading assembles each
// local tensor from the overlapping pieces of whatever layout was saved (resharding).
// The distributed optimizer's files hold flat pieces: elements [begin, end) of a (tp, pp)
// rank's slice, recorded with the slice's placement (`...;slice_shape=[32, 32];flat=[0, 960]`);
// a load joins the pieces of every data-parallel file of a slice into the slice and reshards
// that, so it loads at any DP, TP and PP and with or without the distributed optimizer.
//
// Saving is atomic across ranks: every writer writes into the same DIR/iter_N.tmp-<token>
// and fsyncs its files; after all have finished, one rank writes metadata.json with every
// checksum, fsyncs, renames the folder to iter_N and only then replaces the tracker (temp
// file, fsync, rename), so a crash at any moment leaves the previous checkpoint loadable.
// Loading checks the checksum of every file it copies from and every tensor's name, dtype
// and global shape before anything is copied, and never executes anything from a file.
#pragma once

#include <signal.h>

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "tessera/core/tensor.h"

namespace tessera {

// A checkpoint tensor's bytes to and from host memory through its device's copies, one
// tensor or one contiguous piece at a time; a tensor without a device is host memory (the
// converters' own buffers). `offset` and `bytes` are within the tensor.
void read_tensor_bytes(const Tensor& t, void* dst);
void write_tensor_bytes(const Tensor& t, size_t offset, const void* src, size_t bytes);

// A whole tensor (tools that work on full parameters).
struct NamedTensor {
  std::string name;
  Tensor tensor;
};

// One rank's slice of a tensor: the elements [offset, offset + tensor.shape[split_dim]) of
// the global tensor along split_dim (every other dimension whole), or the whole tensor
// (split_dim -1, tensor.shape == global_shape).
struct ShardedTensor {
  std::string name;
  Tensor tensor;
  Shape global_shape;
  int split_dim = -1;
  int64_t offset = 0;
};

// How the saving run was parallelised.
struct CheckpointLayout {
  int tensor_parallel = 1;
  int pipeline_parallel = 1;
  int data_parallel = 1;
  int virtual_stages = 1;
  int64_t padded_vocab_size = 0;  // 0: not recorded (format version 1)
};

struct CheckpointState {
  int64_t iteration = 0;
  int64_t consumed_train_samples = 0;
  int64_t consumed_valid_samples = 0;
  int64_t scheduler_num_steps = 0;  // samples, as Megatron's OptimizerParamScheduler counts
  int64_t optimizer_steps = 0;      // Adam's step count (bias correction)
  nlohmann::json scheduler;         // the schedule's settings, compared on resume
  nlohmann::json args;              // the arguments the run used
  nlohmann::json grad_scaler;       // the fp16 loss scaler's state_dict (null without one)
  CheckpointLayout layout;
  int format_version = 0;  // as read (saving writes the current one)
  // The distributed optimizer's data-parallel shards: files optimizer_dp_NNN.safetensors per
  // (tp, pp) folder (0: one optimizer.safetensors), and whether they hold the fp32 main
  // parameters of a 16-bit model ("main.<parameter name>"; model.safetensors then holds the
  // 16-bit parameters widened).
  int optimizer_dp_shards = 0;
  bool main_params_in_optimizer = false;
  // Read from Megatron-LM's own files (megatron_checkpoint.h): `args` is its Namespace's
  // attributes and `scheduler` its opt_param_scheduler state, under Megatron's keys.
  bool megatron_format = false;
  // A Megatron release checkpoint (kReleaseIteration): megatron/training/checkpointing.py
  // load_checkpoint starts it at iteration 0 and loads neither optimizer nor RNG state, as
  // with --finetune, but keeps the consumed samples of its args.
  bool release = false;
};

// A file of a checkpoint folder as metadata.json records it.
struct CheckpointFile {
  std::string path;  // relative to the iteration folder: "mp_rank_00_001/model.safetensors"
  std::string sha256;
  uint64_t bytes = 0;
};

// The iteration that names a Megatron release checkpoint: a tracker holding "release" and the
// folder DIR/release (Megatron's checkpoint converter writes them; checkpointing.py
// read_metadata / get_checkpoint_name). Megatron never saves an iteration below 1.
inline constexpr int64_t kReleaseIteration = -1;

// DIR/iter_0000100, or DIR/release for kReleaseIteration.
std::string checkpoint_iteration_dir(const std::string& dir, int64_t iteration);
// "mp_rank_01" (pp_size 1) or "mp_rank_01_002".
// Expert-parallel ranks other than 0 write their experts into mp_rank_TT_PPP_EEE.
std::string checkpoint_shard_folder(int tp_rank, int pp_rank, int pp_size, int ep_rank = 0);

// ---- Saving from many ranks: the steps, in order (the caller runs the collectives) ----
// 1. One rank: creates DIR and a fresh DIR/iter_N.tmp-<token> with a record of who made it
//    (removed again when the folder is committed); returns its path. Every rank must use the
//    same token (the trainer broadcasts global rank 0's process id).
std::string prepare_checkpoint_save(const std::string& dir, int64_t iteration, int64_t token);
std::string checkpoint_temp_dir(const std::string& dir, int64_t iteration, int64_t token);
// 2. Every writer (data-parallel rank 0 of each (tp, pp)): writes TMP/<shard>/model.safetensors
//    and, unless `optimizer` is empty, optimizer.safetensors, fsynced; returns their records.
//    `model_storage` WidenToF32: the model's 16-bit tensors are written as F32 (exact), widened
//    piece by piece as they are staged (a 16-bit run's model file beside the distributed
//    optimizer's f32 main parameters, as Megatron's).
enum class FloatStorage { AsIs, WidenToF32 };
std::vector<CheckpointFile> write_checkpoint_shard(const std::string& tmp_dir, const std::string& shard,
                                                   const std::vector<ShardedTensor>& model,
                                                   const std::vector<ShardedTensor>& optimizer,
                                                   FloatStorage model_storage = FloatStorage::AsIs);
// 2b. With the distributed optimizer, every data-parallel rank of each (tp, pp): writes its
//    owned ranges of the optimizer state as TMP/<shard>/optimizer_dp_<dp_rank>.safetensors.
//    (Loads take flat pieces too: load_checkpoint_pieces.)
struct FlatPiece {
  ShardedTensor slice;  // the (tp, pp) rank's slice it is cut from (only its tensor's shape is used)
  int64_t begin = 0, end = 0;  // flat elements within the slice
  Tensor values;               // [end - begin]
};
CheckpointFile write_optimizer_dp_shard(const std::string& tmp_dir, const std::string& shard, int dp_rank,
                                        const std::vector<FlatPiece>& pieces);
std::string optimizer_dp_shard_file(int dp_rank);
// 3. One rank, after every writer has finished: metadata.json (with `files`), fsyncs, the
//    rename to DIR/iter_N (replacing an older folder of that iteration), the tracker.
void commit_checkpoint_save(const std::string& dir, const std::string& tmp_dir, const CheckpointState& state,
                            const std::vector<CheckpointFile>& files);

// SIGINT and SIGTERM during a save (a process without --exit-signal-handler, whose signals
// kill it): for the life of this object a handler only records the signal; the writers
// check for it between the pieces they stage (throw_if_save_interrupted), so the save fails
// like any other failed save, and its failure path removes TMP, on rank 0, after every rank
// has stopped writing into it; then reraise() lets the signal kill the process as it would
// have. Recording and checking, rather than removing TMP inside the handler: removing a tree
// is not async-signal-safe (std::filesystem allocates), and with several ranks the others may
// still be writing into TMP. A handler on a computing thread is unsafe in tessera
// (train/exit_signal.h); no thread computes while a save runs. The handler resets itself when
// it runs (SA_RESETHAND), so a second signal kills at once: a save stuck on a dead rank can
// still be stopped, leaving TMP to the next run's clean-up (report_stale_checkpoint_saves).
// A signal ignored when the scope starts (nohup) stays ignored.
class SaveSignalScope {
 public:
  SaveSignalScope();
  ~SaveSignalScope();
  SaveSignalScope(const SaveSignalScope&) = delete;
  SaveSignalScope& operator=(const SaveSignalScope&) = delete;
  // The signal received since the scope began, 0 if none.
  int received() const;
  // Restores the previous handlers and raises received() (which must be set): the process
  // dies of it, or, where a previous handler returns, exits with 128 + the signal.
  [[noreturn]] void reraise();

 private:
  void restore();
  struct sigaction previous_[2] = {};  // SIGINT's and SIGTERM's handlers before the scope
  bool installed_[2] = {false, false};
};
// Throws a runtime Error ("interrupted by SIGINT") once a SaveSignalScope has recorded a signal.
void throw_if_save_interrupted();
// "SIGINT", "SIGTERM".
std::string save_signal_name(int sig);

// A failed save: removes TMP and everything in it (never throws: the save's own error is the
// one to report, and its partial files must not stay to fill the disk).
void abandon_checkpoint_save(const std::string& tmp_dir);

// Temporary folders in DIR (iter_N.tmp-<token>) that no running save owns, such as those a
// kill -9 left. One is provably abandoned, and `removable`, when its owner record says that
// it was made on this machine, in this boot and PID namespace, by a process that no longer
// runs (no process of that id, or one that started at another time). Anything else (made on
// another node of a shared file system, before a reboot, in another container, or with no
// record) is only reported: its maker may still be writing it.
struct StaleCheckpointSave {
  std::string path;
  bool removable = false;
  std::string owner;  // who made it and why it is (or is not) known to be abandoned
};
std::vector<StaleCheckpointSave> find_stale_checkpoint_saves(const std::string& dir);

// All three steps in one process, as one (tp 0, pp 0) shard of layout `state.layout` (whole
// tensors: one process, `tessera ckpt import-hf`). optimizer may be empty (--no-save-optim).
void save_checkpoint(const std::string& dir, const CheckpointState& state, const std::vector<NamedTensor>& model,
                     const std::vector<NamedTensor>& optimizer);

// The iteration named by DIR's tracker (kReleaseIteration for "release"); nullopt when DIR
// holds no checkpoint yet.
// A malformed tracker is an Error naming the file.
std::optional<int64_t> latest_checkpoint_iteration(const std::string& dir);

// metadata.json of a checkpoint (no tensor is read). Errors name the file.
CheckpointState read_checkpoint_metadata(const std::string& dir, int64_t iteration);

// Loads the checkpoint of `iteration` into this rank's slices, whatever layout it was saved
// with: each tensor is assembled from the saved pieces that overlap it. Global shapes and
// dtypes must match (else an Error naming the file, the tensor and both shapes), every piece
// must be there (else an Error naming the tensor and what is missing), and every file copied
// from has its size and SHA-256 checked first. Optimizer tensors only when load_optimizer.
// Where several files hold the same piece (parameters every TP rank holds whole), those of
// the saved TP rank that holds this rank's slices (tp_rank of tp_size in this run) are read
// first, so that each rank reads as few files as it can (only its own in the saved layout).
CheckpointState load_checkpoint(const std::string& dir, int64_t iteration, const std::vector<ShardedTensor>& model,
                                const std::vector<ShardedTensor>& optimizer, bool load_optimizer, int tp_rank = 0,
                                int tp_size = 1);
// The same with targets that are flat pieces of their slices (the distributed optimizer's
// owned ranges): each slice's saved pieces stream past its target, which keeps only its
// elements [begin, end), so no host copy of a slice is made beyond one saved piece (one
// joined from data-parallel files, or a Megatron tensor). A target's values may be 16-bit
// where the files hold F32 (a 16-bit model's parameters from f32 values): they are rounded
// to nearest even, as the optimizer rounds its main parameters.
CheckpointState load_checkpoint_pieces(const std::string& dir, int64_t iteration, const std::vector<FlatPiece>& model,
                                       const std::vector<FlatPiece>& optimizer, bool load_optimizer, int tp_rank = 0,
                                       int tp_size = 1);
// Whole slices as flat pieces of all their elements.
std::vector<FlatPiece> whole_pieces(const std::vector<ShardedTensor>& slices);
// Whole tensors (tools): the full parameters, assembled from any layout.
CheckpointState load_checkpoint(const std::string& dir, int64_t iteration, const std::vector<NamedTensor>& model,
                                const std::vector<NamedTensor>& optimizer, bool load_optimizer);

// Where a tensor of a checkpoint file sits in its global tensor, from the file's safetensors
// metadata (`global_shape=[64, 32];split_dim=0;offset=[32, 0]`). nullopt when the file records
// none for it or the record does not parse.
struct TensorPlacement {
  Shape global_shape;
  int split_dim = -1;
  int64_t offset = 0;
};
std::optional<TensorPlacement> parse_tensor_placement(const std::string& text, const Shape& local_shape);

// ---- Pieces saved in another format (Megatron-LM's files, megatron_checkpoint.h) -----------
// They are resharded by the same planning as tessera's own files, with the same checks.
struct ExternalSource {
  std::string path;
  int tp_rank = -1;  // the saved tensor-parallel rank of the file
};
struct ExternalPiece {
  std::string name;  // tessera's name ("<kind>.<parameter name>" for optimizer state)
  Shape shape;       // as saved
  TensorPlacement place;
  size_t source = 0;  // index into the sources
};
// Fills every target (its elements [begin, end) of its slice; F32, or 16-bit rounded) from
// the pieces that overlap it, reading first the pieces of saved TP rank `preferred_tp_rank`;
// read(i) returns piece i's elements as float. A target no piece covers, or a global shape
// that differs, is an Error naming the tensor and the file.
void load_external_pieces(const std::string& it_dir, const std::vector<ExternalSource>& sources,
                          const std::vector<ExternalPiece>& pieces, const std::vector<FlatPiece>& targets,
                          int preferred_tp_rank, const char* what,
                          const std::function<std::vector<float>(size_t)>& read);

// Step 3 of a save without metadata.json (Megatron's layout): fsyncs, renames TMP to
// DIR/iter_N (replacing an older folder of that iteration) and then replaces the tracker.
void commit_checkpoint_folder(const std::string& dir, const std::string& tmp_dir, int64_t iteration);

}  // namespace tessera
