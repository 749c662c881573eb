// Checkpoints in a layout familiar to Megatron users (megatron.md §5.1), written by tessera:
//
//   DIR/latest_checkpointed_iteration.txt      the iteration, decimal, no newline
//   DIR/iter_0000100/metadata.json             iteration, consumed samples, scheduler,
//                                              optimizer step, the arguments used, and the
//                                              SHA-256 of every file below
//   DIR/iter_0000100/mp_rank_00/model.safetensors      parameters (fp32), Megatron names
//   DIR/iter_0000100/mp_rank_00/optimizer.safetensors  Adam moments / SGD momentum
//
// One folder per (tp, pp) shard (`mp_rank_{tp:02d}` or `mp_rank_{tp:02d}_{pp:03d}`); every
// tensor records its global shape and its offset in it (the safetensors metadata), so a
// later reshard can place it. Saving is atomic: everything is written into
// DIR/iter_N.tmp-<pid>, fsynced and renamed, and only then is the tracker replaced (temp
// file, fsync, rename), so a crash at any moment leaves the previous checkpoint loadable.
// Loading checks every file's checksum and every tensor's name and shape before anything
// is copied, and never executes anything from a file.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "tessera/core/tensor.h"

namespace tessera {

struct NamedTensor {
  std::string name;
  Tensor tensor;
};

struct CheckpointState {
  int64_t iteration = 0;
  int64_t consumed_train_samples = 0;
  int64_t consumed_valid_samples = 0;
  int64_t scheduler_num_steps = 0;  // samples, as Megatron's OptimizerParamScheduler counts
  int64_t optimizer_steps = 0;      // Adam's step count (bias correction)
  nlohmann::json scheduler;         // the schedule's settings, compared on resume
  nlohmann::json args;              // the arguments the run used
};

// Writes the checkpoint of `state.iteration` (optimizer may be empty: --no-save-optim).
void save_checkpoint(const std::string& dir, const CheckpointState& state, const std::vector<NamedTensor>& model,
                     const std::vector<NamedTensor>& optimizer);

// The iteration named by DIR's tracker; nullopt when DIR holds no checkpoint yet.
// A malformed tracker is an Error naming the file.
std::optional<int64_t> latest_checkpoint_iteration(const std::string& dir);

// Loads the checkpoint of `iteration` into the given tensors (same names and shapes, else an
// Error naming the tensor and both shapes); optimizer tensors only when load_optimizer.
CheckpointState load_checkpoint(const std::string& dir, int64_t iteration, const std::vector<NamedTensor>& model,
                                const std::vector<NamedTensor>& optimizer, bool load_optimizer);

}  // namespace tessera
