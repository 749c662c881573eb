// The training loop of Megatron's pretrain(): per iteration, the global batch in
// micro-batches (forward, backward, gradients accumulated), global-norm clipping, the
// optimizer step, the LR schedule in samples, and Megatron's log line.
#pragma once

#include <chrono>
#include <cstdio>
#include <functional>
#include <map>
#include <memory>
#include <optional>

#include "tessera/comm/communicator.h"
#include "tessera/ckpt/checkpoint.h"
#include "tessera/ckpt/zip_archive.h"
#include "tessera/core/tensor.h"
#include "tessera/device/buffer.h"
#include "tessera/metrics/tensorboard_writer.h"
#include "tessera/model/gpt.h"
#include "tessera/optim/lr_schedule.h"
#include "tessera/optim/optimizer.h"
#include "tessera/parallel/data_parallel.h"
#include "tessera/train/arguments.h"
#include "tessera/train/batch_loader.h"
#include "tessera/train/pipeline_executor.h"
#include "tessera/train/sample_source.h"
#include "tessera/train/spike_guard.h"
#include "tessera/train/step_graph.h"

namespace tessera {

struct MegatronFileSpec;

struct IterationResult {
  double lm_loss = 0.0;    // token-weighted mean over the global batch
  double grad_norm = 0.0;  // before clipping
  double lr = 0.0;         // the learning rate this iteration's update used
  int64_t tokens = 0;      // tokens processed
  bool skipped = false;    // the update was skipped (--skip-spikes, an fp16 overflow)
  // The scaler's scale after this iteration's update, which Megatron logs (training.py reads
  // optimizer.get_loss_scale() after the step); the backward used the one before it.
  double loss_scale = 1.0;
  int64_t global_batch = 0;  // samples in this iteration (smaller during --rampup-batch-size)
  int64_t host_reads = 0;    // copies to the host the step waited for (train_step makes one)
  // Megatron's MoE aux-loss tracker after track_moe_metrics' scaling: per layer of the whole
  // model, each MoE layer's load-balancing loss and z-loss (divided by their coefficients)
  // summed over the pipeline stages and averaged over the micro-batches (empty without MoE).
  std::vector<double> moe_load_balancing, moe_z;
};

// The groups one rank trains in (parallel/topology.h). A null member, or a group of one,
// means that dimension is not split.
struct TrainerGroups {
  Communicator* world = nullptr;           // agreeing on early exits
  // The data-parallel group with context parallelism (DP x CP, Megatron's dp-cp): gradient
  // averaging, the distributed optimizer's shards, loss sums. CP ranks share their samples.
  Communicator* dp = nullptr;
  Communicator* tp = nullptr;              // sequence-parallel replicated gradients
  Communicator* pp = nullptr;              // activations between stages; the loss leaves the last
  Communicator* model_parallel = nullptr;  // tp x pp: the gradient norm
  Communicator* embedding = nullptr;       // the tied embedding's gradient, first and last stage
  Communicator* cp = nullptr;              // context parallelism: which rows of each sample this rank holds
  // Expert parallelism (null for EP 1): the experts' gradient norm spans the EP group, and
  // their gradients are averaged over the expert data-parallel group.
  Communicator* ep = nullptr;
  Communicator* expert_dp = nullptr;
};

// Megatron's memory report (report_memory in megatron/training/utils.py) for this rank, in MB
// as Python prints floats, with the process's peak resident memory (getrusage) after it:
// "[Rank R] (after N iterations) memory (MB) | allocated: A | max allocated: M | reserved: A |
// max reserved: M | peak resident: P". Every buffer comes from the backend directly (there is
// no caching allocator holding freed blocks), so reserved equals allocated.
std::string memory_report_line(int rank, int64_t iterations, const Device& device);

// --save's folders that a save left unfinished (ckpt/checkpoint.h, find_stale_checkpoint_saves):
// each reported, and removed when provably abandoned. Global rank 0 runs it at start-up.
void report_stale_checkpoint_saves(const std::string& dir);

// The gradient/parameter buffer layout of pipeline rank pp_rank's model under `args`
// (Megatron's rules: buckets of --ddp-bucket-size only with --overlap-grad-reduce and only on
// the first pipeline stage; the distributed optimizer's padding for the data-parallel size).
// tessera train builds its model with it; the memory estimate uses its options.
GradBufferOptions grad_buffer_options(const TrainArgs& args, int pp_rank);
GradBufferLayout grad_buffer_layout(const TrainArgs& args, const ModelPartition& partition, int pp_rank);

class Trainer {
 public:
  // The model is this rank's share, initialised (Megatron's init or --init-from-hf) by the
  // caller with at least pipeline_slots(args, pp_rank) slots; every data-parallel replica
  // must start from the same weights.
  Trainer(const TrainArgs& args, GPTModel& model, DataSources data, Device& device, TrainerGroups groups = {});
  // Takes back from the model the norm slots it handed (the model may outlive the trainer).
  ~Trainer();
  Trainer(const Trainer&) = delete;
  Trainer& operator=(const Trainer&) = delete;

  // Activation and I/O slots per chunk the training and evaluation schedules need on
  // pipeline rank pp_rank.
  static std::pair<std::vector<int>, std::vector<int>> pipeline_slots(const TrainArgs& args, int pp_rank);

  // One iteration over the next global batch.
  IterationResult train_step();
  // train_step until --train-iters, logging every --log-interval, validating every
  // --eval-interval, and on the validation and test splits at the end.
  void train();
  // --eval-iters global batches of `split` without dropout; the token-weighted mean loss.
  // Validation continues where the previous evaluation stopped (Megatron's persistent
  // validation iterator); test starts at 0.
  double evaluate(const char* split);

  // --load: resumes from DIR's latest checkpoint (model, optimizer and loss scaler unless
  // --no-load-optim, iteration, consumed samples, LR schedule), or with --finetune loads only
  // the model; whatever (TP, PP, DP) layout saved it (each rank assembles its slices).
  // A folder without a checkpoint starts from scratch with a warning, as Megatron does.
  // Collective over the world: a rank that fails makes every rank fail.
  void load_checkpoint(const std::string& dir);
  // --save: writes the checkpoint of the current iteration. Collective over the world:
  // data-parallel rank 0 of each (tp, pp) writes its shard, global rank 0 commits. A failure
  // on any rank fails every rank and removes the temporary folder.
  void save_checkpoint(const std::string& dir);

  int64_t iteration() const { return iteration_; }
  int64_t consumed_samples() const { return consumed_samples_; }
  const Optimizer& optimizer() const { return *optimizer_; }
  // The data-parallel bucket traffic (null without data parallelism).
  const DataParallelBuckets* data_parallel() const { return dp_buckets_.get(); }

 private:
  void load_micro_batch(const std::vector<int32_t>& global_batch, int64_t micro);
  // Uploads this rank's micro-batches of the global batch at `consumed`; their count.
  int64_t load_global_batch(BatchLoader& loader, int64_t consumed, bool training);
  // Runs the pipeline schedule (forward, and backward when training) over the num_micro
  // micro-batches loaded, leaving this rank's masked loss and mask sums in loss_sums_ on the
  // device. Training scales the loss by loss_scale (fp16's loss scaler).
  void run_global_batch(int64_t num_micro, bool training, double loss_scale = 1.0);
  // A training step's device work after the upload: zeroed gradients, run_global_batch, the
  // norm; captured and replayed under --enable-cuda-graph (step_graph.h).
  void run_step_region(int64_t num_micro, double loss_scale);
  // The masked loss sum and the mask sum over the global batch, on every rank, from this
  // rank's sums read back (host_sums: loss_sums_'s two doubles).
  std::pair<double, double> global_loss_sums(const double* host_sums);
  const PipelineExecutor& training_pipeline(int64_t num_micro);
  // After backward: data-parallel averaging, then the gradients several ranks share.
  void finalize_grads();
  // The global gradient norm over the model-parallel ranks (with the distributed optimizer
  // over every rank, each holding shards), each parameter counted once, on the device: the
  // slots in norm_sums_, the norm and found-inf in norm_result_, and the clipping factor in
  // the optimizer's step scalars.
  void global_grad_norm();
  // The norm's chunk tables (ops.h), one per gradient buffer, and their workspace.
  void build_norm_tables();
  std::vector<int64_t> squared_in_backward() const;
  // The step's one read-back: loss_sums_, norm_sums_ and norm_result_ into step_host_.
  void read_step_sums();
  const double* host_at(size_t offset) const { return step_host_.data() + offset / sizeof(double); }
  // The norm slot of parameter i's gradient on this rank.
  size_t norm_slot(size_t i) const;
  bool counts_in_norm(size_t i) const;
  bool distributed_optimizer() const { return dp_buckets_ && args_.use_distributed_optimizer; }
  // Whether the norm adds the squares of each rank's owned pieces (the distributed optimizer,
  // outside --deterministic-mode) rather than of whole gradients; and parameter i's gradient
  // it reads on this rank (empty: none).
  bool norm_over_pieces() const { return distributed_optimizer() && !device_.deterministic_mode(); }
  const Tensor& norm_grad(size_t i) const { return norm_over_pieces() ? main_grads_[i] : model_.grads()[i]; }
  // f32 values of whole parameters in host memory, one buffer over the gradient-buffer layout
  // per name prefix, with checkpoint tensors "<prefix><parameter name>" viewing them: only
  // for Megatron's distrib_optim.pt, which holds them whole (tessera's own checkpoints stream
  // every tensor and piece in place).
  struct HostOptimizerState {
    std::vector<std::vector<float>> buffers;
    std::vector<ShardedTensor> tensors;
  };
  HostOptimizerState host_whole_params(const std::vector<std::string>& prefixes, bool with_embedding_copy) const;
  // Megatron's distrib_optim.pt: the main parameters and, unless main_only, the optimizer
  // state as whole buffers over the buffer layout, prefixes "" and "<kind>." (collective over
  // the DP group with the distributed optimizer; copied at DP 1); and the files DP rank 0
  // writes with --ckpt-format torch.
  HostOptimizerState host_distrib_optim_state(bool main_only) const;
  void write_megatron_files(const std::string& tmp_dir, const HostOptimizerState& whole) const;
  // What Megatron's files record of this run beside the tensors (--ckpt-format torch and torch_dist).
  MegatronFileSpec megatron_file_spec() const;
  // --ckpt-format torch_dist: this rank's .distcp (DP rank 0 of each (tp, pp), and with the
  // distributed optimizer every DP rank its ranges); returns its storage records (ckpt/torch_dist.h).
  nlohmann::json write_torch_dist_files(const std::string& tmp_dir) const;
  // The rng_state object a torch_dist save writes for this rank: the one a torch_dist resume
  // at the same TP/PP loaded (loaded_rng_state_), or the states Megatron's seeding leaves.
  std::function<void(const zip::StoredWriter::Append&)> torch_dist_rng_state() const;
  // save_checkpoint's work between Megatron's "saving" and "successfully saved" lines.
  void write_checkpoint(const std::string& dir);
  // What this data-parallel rank saves of the distributed optimizer: its owned ranges of the
  // state and of a 16-bit model's main parameters ("main.<name>"), as flat pieces viewing
  // the optimizer's tensors (a load fills the same pieces).
  std::vector<FlatPiece> owned_optimizer_pieces() const;
  std::vector<FlatPiece> owned_state_pieces(bool with_embedding_copy) const;  // "<kind>.<name>"
  // Owned piece `piece` (of dp_buckets_->owned_pieces()) as "<prefix><name>" viewing `values`.
  void add_owned_piece(std::vector<FlatPiece>& out, const std::string& prefix, size_t piece, const Tensor& values,
                       bool with_embedding_copy) const;
  // A 16-bit model's f32 main parameters, which checkpoints keep under the parameters' names
  // (a 16-bit weight is their rounding): the optimizer's whole tensors, or with the
  // distributed optimizer its owned pieces. With the distributed optimizer, whose
  // data-parallel files hold the main parameters, model.safetensors holds the 16-bit
  // parameters widened (as Megatron's model file).
  bool main_params_apart() const { return model_.config().params_dtype != DType::F32; }
  std::vector<ShardedTensor> main_param_tensors(bool with_embedding_copy) const;
  // Which parameters this rank writes into a checkpoint (one replica of each), and those of
  // `tensors` (parameters, or optimizer state named "<kind>.<parameter>" when `state`).
  bool saves_param(const ParamShard& s) const;
  bool saves_any_param() const;
  std::vector<ShardedTensor> saved_here(std::vector<ShardedTensor> tensors, bool state) const;
  std::vector<FlatPiece> main_param_pieces(bool with_embedding_copy) const;
  void print_evaluation(const std::string& prefix, const char* split);
  void write_tensorboard(const IterationResult& r);
  [[noreturn]] void report_non_finite(const IterationResult& r) const;
  // Why training should stop after this iteration (nullptr: it should not).
  const char* exit_reason(std::chrono::steady_clock::time_point start);
  void log_line(const IterationResult& last, double loss_sum, int advanced, int skipped, double elapsed_s,
                int64_t tokens);

  const TrainArgs& args_;
  GPTModel& model_;
  Device& device_;
  TrainerGroups groups_;
  Communicator* dp_;  // groups_.dp when it has more than one rank
  std::unique_ptr<DataParallelBuckets> dp_buckets_;  // with data parallelism
  void take_moe_metrics(IterationResult& r, int64_t num_micro);
  void write_moe_tensorboard(const std::string& name, const std::vector<double>& layers);
  // The logged MoE losses (track_moe_metrics' mean over layers) summed since the last log line.
  double moe_load_balancing_sum_ = 0, moe_z_sum_ = 0;
  double dp_exposed_logged_s_ = 0;  // dp_buckets_->exposed_seconds() at the last JSON log record
  // Per parameter, the gradient the optimizer reads (clipping, TP and embedding sums): the
  // whole gradient, or with the distributed optimizer the owned piece (empty when none).
  std::vector<Tensor> main_grads_;
  // Training schedules by micro-batch count (one, unless the batch size ramps up).
  std::map<int64_t, PipelineExecutor> train_pipelines_;
  PipelineExecutor eval_pipeline_;
  std::unique_ptr<Optimizer> optimizer_;
  std::optional<LossScaler> loss_scaler_;  // --fp16, or --loss-scale with --bf16
  std::unique_ptr<metrics::TensorBoardWriter> tensorboard_;  // --tensorboard-dir, on the logging rank
  bool unknown_peak_noted_ = false;  // --log-throughput without a known peak: said once, not on every line
  LrScheduler scheduler_;
  Buffer batch_slab_;
  std::vector<MicroBatch> batches_;  // this rank's micro-batches of the current global batch
  // Host staging of batch_slab_ (the same layout, pinned): a micro-batch is assembled here
  // and uploaded in one copy.
  std::unique_ptr<void, std::function<void(void*)>> batch_staging_;
  std::vector<size_t> batch_offsets_;  // in both, per micro-batch: MicroBatch's four tensors in order
  std::vector<double> mask_sums_;    // per micro-batch, from the host staging
  // Doubles on the device (ops.h: I64 tensors holding doubles), read back together once a
  // training step: the masked loss and mask sums of a global batch, the squared gradient
  // norm per (parameter, TP rank), and the norm and found-inf (grad_norm_finish). After them
  // in the slab, not read back: the norm's chunk tables and workspace.
  Buffer scalars_slab_;
  Tensor iteration_scalar_;  // I32 [1]: the iteration for the dropout kernels (StepContext)
  std::unique_ptr<StepGraphs> step_graphs_;  // --enable-cuda-graph
  Tensor loss_sums_, norm_sums_, norm_result_, norm_workspace_;
  Tensor step_sums_;               // the slab's first bytes, from loss_sums_ to norm_result_'s end
  std::vector<double> step_host_;  // step_sums_ read back
  struct NormSlab {
    Tensor grad, chunks;  // a gradient buffer from its start, and its table
  };
  std::vector<NormSlab> norm_slabs_;
  ZScoreWindow loss_window_, grad_norm_window_;  // --skip-spikes
  SamplerLayout layout_;
  data::LtorOptions masks_;
  data::LtorSample sample_;  // one sample's tokens, labels, mask and positions
  std::unique_ptr<BatchLoader> train_loader_, valid_loader_, test_loader_;
  int64_t iteration_ = 0;
  int64_t consumed_samples_ = 0;
  int64_t consumed_valid_samples_ = 0;
  // The rng_state payload of a torch_dist checkpoint resumed at its own TP/PP, saved again as it
  // was (ckpt/torch_dist.h read_torch_dist_rng_state).
  std::optional<std::vector<uint8_t>> loaded_rng_state_;
  std::unique_ptr<FILE, int (*)(FILE*)> log_json_{nullptr, &std::fclose};
};

}  // namespace tessera
