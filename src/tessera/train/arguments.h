// `tessera train`'s arguments: Megatron-LM's flag names and defaults
// (megatron/training/arguments.py), parsed by the declarative table in arguments.cpp and
// checked before any allocation.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "tessera/model/gpt_config.h"
#include "tessera/model/model_partition.h"
#include "tessera/optim/loss_scaler.h"
#include "tessera/optim/lr_schedule.h"
#include "tessera/optim/optimizer.h"
#include "tessera/core/options.h"
#include "tessera/data/dataset_config.h"
#include "tessera/data/tokenizer.h"

namespace tessera {

struct TrainArgs {
  GPTConfig model;
  int make_vocab_size_divisible_by = 128;
  data::TokenizerOptions tokenizer;
  int32_t eod = 0;           // the tokenizer's end-of-document id
  int32_t pad = -1;          // the tokenizer's pad id (no loss on it), -1 for none
  data::DataArgs data;       // --data-path, --split, --mock-data, masks, cache

  int64_t micro_batch_size = 0;
  int64_t global_batch_size = 0;
  int64_t train_iters = 0;  // derived from --train-samples when sample-based
  std::optional<int64_t> train_samples;
  int log_interval = 100;
  bool log_throughput = false;
  double peak_tflops_per_device = 0;  // 0: from the device table (train/throughput.h)
  std::string tensorboard_dir;  // empty: no TensorBoard
  int tensorboard_log_interval = 1;
  bool log_loss_scale_to_tensorboard = true;
  bool log_validation_ppl_to_tensorboard = false;
  bool log_memory_to_tensorboard = false;
  bool moe_per_layer_logging = false;  // --moe-per-layer-logging: each MoE layer's losses to TensorBoard

  // Mixed precision (docs/precision.md): the GEMMs' format, fp32 master weights throughout.
  bool fp16 = false, bf16 = false;
  std::optional<LossScalerConfig> loss_scaler;  // fp16 (dynamic or static), or bf16 with --loss-scale
  int eval_interval = 1000;
  int eval_iters = 100;

  OptimizerConfig optimizer;
  LrScheduleConfig lr_schedule;

  std::string init_from_hf;
  std::string log_json;
  std::string device = "cpu";  // --device, as device/registry.h spells it
  bool tf32 = false;           // --tf32: Device::set_tf32_matmul (CUDA only)
  bool deterministic_mode = false;  // --deterministic-mode: Device::set_deterministic_mode
  bool enable_cuda_graph = false;   // --enable-cuda-graph: the step captured and replayed (step_graph.h)
  std::vector<std::string> command_line;  // the flags as given (recorded in checkpoints)

  // Checkpoints (docs/checkpoints.md).
  std::string save, load;
  int64_t save_interval = 0;
  int64_t exit_interval = 0;  // --exit-interval: stop (after saving) when iteration % N == 0
  double exit_duration_minutes = 0;  // --exit-duration-in-mins: stop (after saving) after this long
  bool exit_signal_handler = false;  // --exit-signal-handler: SIGTERM saves, then exits 0
  bool check_for_nan = true;         // off with --no-check-for-nan-in-loss-and-grad
  bool dry_run = false;              // --dry-run: validate, print the memory estimate, stop
  double skip_spikes = 0;            // --skip-spikes Z (0: off)
  bool no_save_optim = false, no_load_optim = false, finetune = false;
  bool no_save_rng = false;  // --ckpt-format torch leaves out Megatron's rng_state
  bool no_load_rng = false;  // a torch_dist resume does not carry the checkpoint's rng_state on
  // --ckpt-format: what --save writes. torch_dist (the default, Megatron's): Megatron-LM's
  // distributed checkpoint (ckpt/torch_dist.h); torch: its legacy files (ckpt/megatron_checkpoint.h);
  // tessera: tessera's own (ckpt/checkpoint.h). --load reads any of them, whatever this says.
  bool save_torch_dist = true;
  bool save_megatron_format = false;
  // --ckpt-convert-format F --ckpt-convert-save DIR: --load's checkpoint saved in F into DIR/F
  // (then `save` and the save format are those), no training.
  std::string ckpt_convert_format, ckpt_convert_save;
  bool use_checkpoint_args = false;  // --use-checkpoint-args: the model flags from --load's checkpoint
  bool use_checkpoint_scheduler = false, override_scheduler = false;

  // Parallel layout: world = TP x CP x DP x PP.
  int world_size = 1;
  int tensor_parallel_size = 1;
  int context_parallel_size = 1;  // --context-parallel-size (--cp-comm-type p2p)
  int pipeline_parallel_size = 1;
  bool sequence_parallel = false;
  PipelineSplit pipeline_split;  // PP size, virtual stages, uneven first/last stages
  int data_parallel_size = 1;
  int distributed_timeout_minutes = 10;
  bool overlap_grad_reduce = false;
  // Adam's moments and the fp32 main parameters sharded over the data-parallel ranks
  // (parallel/data_parallel.h); the parameter gather overlapped with the next forward.
  bool use_distributed_optimizer = false;
  bool overlap_param_gather = false;
  int64_t ddp_bucket_size = 0;  // elements; Megatron's default max(4e7, 1e6 x DP) with overlap
  std::string distributed_backend;

  // --rampup-batch-size START INCREMENT SAMPLES (Megatron's RampupBatchsizeNumMicroBatches).
  struct BatchRampup {
    int64_t start = 0, increment = 0, samples = 0;
  };
  std::optional<BatchRampup> rampup;

  // The most micro-batches per data-parallel rank in an iteration (the full global batch).
  // Megatron's data-parallel size with context parallelism: the ranks gradients are averaged
  // over and the distributed optimizer shards over.
  int data_parallel_with_cp() const { return data_parallel_size * context_parallel_size; }
  int64_t num_microbatches() const { return global_batch_size / (micro_batch_size * data_parallel_size); }
  // The global batch of the iteration that starts after `consumed` samples: with a ramp-up,
  // start + increment per SAMPLES/((global - start)/increment) consumed, until SAMPLES.
  int64_t global_batch_at(int64_t consumed) const;
  int64_t num_microbatches_at(int64_t consumed) const {
    return global_batch_at(consumed) / (micro_batch_size * data_parallel_size);
  }
};

// The option table of `tessera train`.
const OptionTable& train_option_table();
// Parses, fills defaults, derives (padded vocabulary, schedule in samples) and validates.
// Throws usage errors naming the flag.
// world_size: processes in the job (from the launcher's environment).
TrainArgs parse_train_args(int argc, char** argv, ParsedOptions* parsed_out = nullptr, int world_size = 1);

}  // namespace tessera
