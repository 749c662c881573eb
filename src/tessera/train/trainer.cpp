#include "tessera/train/trainer.h"

#include <sys/resource.h>

#include <chrono>
#include <algorithm>
#include <cmath>
#include <cstring>
#include <ctime>
#include <map>
#include <string_view>

#include <nlohmann/json.hpp>

#include "tessera/ckpt/checkpoint.h"
#include "tessera/core/error.h"
#include "tessera/core/log.h"
#include "tessera/core/python_format.h"
#include "tessera/device/device.h"
#include "tessera/model/context_parallel.h"
#include "tessera/ops/ops.h"
#include "tessera/train/exit_signal.h"
#include "tessera/train/throughput.h"

namespace tessera {

namespace {

// The optimizer's parameters: the model's, or with the distributed optimizer the pieces this
// data-parallel rank owns.
std::vector<OptimizerParam> optimizer_params(const GPTModel& model, const DataParallelBuckets* sharded) {
  std::vector<OptimizerParam> out;
  if (sharded) {
    for (const DataParallelBuckets::OwnedPiece& p : sharded->owned_pieces())
      out.push_back({p.value, p.grad, model.shards()[p.param].spec.weight_decay});
    return out;
  }
  for (size_t i = 0; i < model.shards().size(); ++i) {
    const ParamShard& s = model.shards()[i];
    out.push_back({model.params()[i], model.grads()[i], s.spec.weight_decay});
  }
  return out;
}

Communicator* if_split(Communicator* c) { return c && c->size() > 1 ? c : nullptr; }

// Sums each value over a group in rank order: the values travel as raw 64-bit patterns and
// every rank adds them in the same order, so the result is exact-to-order and bitwise the
// same on every rank (a float all-reduce is not).
void sum_in_rank_order(Communicator* group, std::vector<double>& values) {
  if (!group) return;
  const int n = group->size(), k = static_cast<int>(values.size());
  std::vector<double> all(static_cast<size_t>(n * k));
  group->all_gather(Tensor(all.data(), DType::I64, {n * k}, nullptr), Tensor(values.data(), DType::I64, {k}, nullptr));
  std::fill(values.begin(), values.end(), 0.0);
  for (int r = 0; r < n; ++r)
    for (int i = 0; i < k; ++i) values[i] += all[r * k + i];
}

PipelineSchedule training_schedule(const TrainArgs& args, int64_t num_micro) {
  return make_pipeline_schedule(args.pipeline_parallel_size, args.pipeline_split.virtual_stages,
                                static_cast<int>(num_micro));
}

PipelineSchedule evaluation_schedule(const TrainArgs& args) {
  return make_forward_only_schedule(args.pipeline_parallel_size, args.pipeline_split.virtual_stages,
                                    static_cast<int>(args.num_microbatches()));
}

std::string timestamp() {
  std::time_t now = std::time(nullptr);
  char buf[32];
  std::strftime(buf, sizeof(buf), "%Y-%m-%d %H:%M:%S", std::localtime(&now));
  return buf;
}

}  // namespace

GradBufferOptions grad_buffer_options(const TrainArgs& args, int pp_rank) {
  GradBufferOptions o;
  o.data_parallel = args.data_parallel_with_cp();
  o.expert_data_parallel = args.data_parallel_with_cp() / args.model.moe.expert_parallel_size;
  o.distributed_optimizer = args.use_distributed_optimizer;
  // Without overlap Megatron reduces all gradients as one bucket after backward; later
  // pipeline stages never split theirs (megatron/core/distributed/distributed_data_parallel.py).
  if (args.overlap_grad_reduce && pp_rank == 0) o.bucket_size = args.ddp_bucket_size;
  return o;
}

GradBufferLayout grad_buffer_layout(const TrainArgs& args, const ModelPartition& partition, int pp_rank) {
  return GPTModel::buffer_layout_for(args.model, partition, grad_buffer_options(args, pp_rank));
}

std::pair<std::vector<int>, std::vector<int>> Trainer::pipeline_slots(const TrainArgs& args, int pp_rank) {
  // The full global batch needs the most slots (a ramp-up's smaller batches fewer).
  const PipelineExecutor train(training_schedule(args, args.num_microbatches()), pp_rank),
      eval(evaluation_schedule(args), pp_rank);
  std::vector<int> act = train.act_slots(), io = train.io_slots();
  for (size_t c = 0; c < act.size(); ++c) {
    act[c] = std::max(act[c], eval.act_slots()[c]);
    io[c] = std::max(io[c], eval.io_slots()[c]);
  }
  return {act, io};
}

Trainer::Trainer(const TrainArgs& args, GPTModel& model, DataSources data, Device& device, TrainerGroups groups)
    : args_(args),
      model_(model),
      device_(device),
      groups_(groups),
      dp_(if_split(groups.dp)),
      eval_pipeline_(evaluation_schedule(args), groups.pp ? groups.pp->rank() : 0),
      scheduler_(args.lr_schedule) {
  // With context parallelism a micro-batch holds this rank's S/CP rows of each sample.
  const int64_t B = args.micro_batch_size, T = args.model.seq_length / args.context_parallel_size,
                M = args.num_microbatches();
  SlabBuilder layout;
  for (int64_t m = 0; m < M; ++m)
    for (DType t : {DType::I32, DType::I32, DType::I32, DType::F32}) batch_offsets_.push_back(layout.reserve(t, {B, T}));
  batch_slab_ = Buffer(device, layout.total_bytes());
  batch_staging_ = {device.allocate_pinned(layout.total_bytes()),
                    [&device, bytes = layout.total_bytes()](void* p) { device.free_pinned(p, bytes); }};
  for (int64_t m = 0; m < M; ++m) {
    const size_t* o = &batch_offsets_[4 * m];
    batches_.push_back({tensor_at(batch_slab_, o[0], DType::I32, {B, T}), tensor_at(batch_slab_, o[1], DType::I32, {B, T}),
                        tensor_at(batch_slab_, o[2], DType::I32, {B, T}), tensor_at(batch_slab_, o[3], DType::F32, {B, T})});
  }
  mask_sums_.resize(M);
  if (args.enable_cuda_graph) {
    if (device.capture_support() == Device::Capture::None)
      throw usage_error("--enable-cuda-graph on " + device.name() + ", which cannot capture work",
                        "CUDA graphs need --device cuda (the strict test device checks a capture without one)");
    step_graphs_ = std::make_unique<StepGraphs>(device);
    log_info(device.capture_support() == Device::Capture::Replay
                 ? " > --enable-cuda-graph: the step's device work is captured on %s and replayed"
                 : " > --enable-cuda-graph: %s checks every step's region as a capture would (nothing is replayed)",
             device.name().c_str());
  }
  if (dp_) {
    const GradBufferLayout expected = grad_buffer_layout(args, model.partition(), groups.pp ? groups.pp->rank() : 0);
    TESSERA_CHECK(model.buffer_layout().numel == expected.numel &&
                      model.buffer_layout().buckets.size() == expected.buckets.size(),
                  "the model's buffers were not laid out by grad_buffer_layout for these arguments");
    const DataParallelOptions o{args.overlap_grad_reduce, args.use_distributed_optimizer, args.overlap_param_gather};
    dp_buckets_ = std::make_unique<DataParallelBuckets>(model.buffer_layout(), model.grad_buffer(),
                                                        model.param_buffer(), *dp_, o, device, groups.expert_dp);
    if (args.overlap_param_gather)
      model.set_params_needed([this](size_t first, size_t end) { dp_buckets_->wait_params(first, end); });
  }
  const DataParallelBuckets* sharded = distributed_optimizer() ? dp_buckets_.get() : nullptr;
  optimizer_ = std::make_unique<Optimizer>(args.optimizer, optimizer_params(model, sharded), device);
  // What sharding divides: Adam's moments (and fp32 main copies), per rank.
  log_info(" > optimizer state on rank %d: %zu bytes (%s)", log_rank(), optimizer_->state_bytes(),
           distributed_optimizer() ? "distributed optimizer: this data-parallel rank's shard" : "whole");
  main_grads_ = model.grads();
  if (distributed_optimizer()) {
    main_grads_.assign(model.grads().size(), Tensor());
    for (const DataParallelBuckets::OwnedPiece& p : dp_buckets_->owned_pieces()) main_grads_[p.param] = p.grad;
  }
  build_norm_tables();
  TESSERA_CHECK((dp_ ? dp_->size() : 1) == args.data_parallel_with_cp(),
                "data-parallel (x context-parallel) group size differs from the args");
  // The dp-cp group lists a data-parallel rank's CP ranks together (cp fastest).
  layout_ = {B, M, args.data_parallel_size, dp_ ? dp_->rank() / args.context_parallel_size : 0};
  masks_ = data.masks;
  TESSERA_CHECK(data.train != nullptr, "no training samples");
  const int S = static_cast<int>(args.model.seq_length);
  train_loader_ = std::make_unique<BatchLoader>(*data.train, S, layout_, [&args](int64_t consumed) {
    return args.num_microbatches_at(consumed);
  });
  if (data.valid) valid_loader_ = std::make_unique<BatchLoader>(*data.valid, S, layout_);
  if (data.test) test_loader_ = std::make_unique<BatchLoader>(*data.test, S, layout_);
  if (args.loss_scaler) loss_scaler_.emplace(*args.loss_scaler);
  // Megatron's TensorBoard writer lives on the last rank, the one that has the loss.
  if (!args.tensorboard_dir.empty() && log_rank() == log_world_size() - 1)
    tensorboard_ = std::make_unique<metrics::TensorBoardWriter>(args.tensorboard_dir);
  if (!args.log_json.empty() && log_rank() == log_world_size() - 1) {  // the rank that logs
    log_json_.reset(std::fopen(args.log_json.c_str(), "a"));
    if (!log_json_) throw runtime_error("--log-json " + args.log_json + " cannot be opened for writing");
  }
  if (!args.save.empty() && log_rank() == 0) report_stale_checkpoint_saves(args.save);  // rank 0 makes them
}

Trainer::~Trainer() { model_.hand_grad_squares(Tensor(), std::vector<int64_t>(model_.shards().size(), -1)); }

// Megatron's get_batch: tokens = sample[:-1], labels = sample[1:], with the loss mask and
// position ids of gpt_dataset.py's _get_ltor_masks_and_position_ids. Every stage loads the
// whole micro-batch: the first needs tokens and positions, the last labels and mask, and the
// copy is small. Assembled in the pinned staging, then uploaded in one copy. With context
// parallelism only this rank's rows (get_batch_on_this_cp_rank), the mask summed over the
// whole sequence (the token count Megatron's loss_func all-reduces over CP).
void Trainer::load_micro_batch(const std::vector<int32_t>& global_batch, int64_t micro) {
  const int64_t B = args_.micro_batch_size, S = args_.model.seq_length, T = S / args_.context_parallel_size;
  const ops::SequenceRows rows = cp_rows(S, args_.context_parallel_size, model_.partition().cp_rank);
  const size_t* o = &batch_offsets_[4 * micro];
  char* staging = static_cast<char*>(batch_staging_.get());
  int32_t* tokens = reinterpret_cast<int32_t*>(staging + o[0]);
  int32_t* positions = reinterpret_cast<int32_t*>(staging + o[1]);
  int32_t* labels = reinterpret_cast<int32_t*>(staging + o[2]);
  float* loss_mask = reinterpret_cast<float*>(staging + o[3]);
  double mask_sum = 0.0;
  for (int64_t b = 0; b < B; ++b) {
    const int32_t* text = global_batch.data() + (micro * B + b) * (S + 1);
    data::make_ltor_sample({text, static_cast<size_t>(S + 1)}, masks_, sample_);
    for (int64_t i = 0; i < S; ++i) mask_sum += sample_.loss_mask[i];
    for (int64_t t = 0; t < T; ++t) {
      const int64_t i = rows.position(t);
      tokens[b * T + t] = sample_.tokens[i];
      labels[b * T + t] = sample_.labels[i];
      positions[b * T + t] = static_cast<int32_t>(sample_.position_ids[i]);
      loss_mask[b * T + t] = sample_.loss_mask[i];
    }
  }
  mask_sums_[micro] = mask_sum;
  const size_t bytes = o[3] + batches_[micro].loss_mask.bytes() - o[0];
  device_.copy_from_host(batch_slab_.handle(), o[0], staging + o[0], bytes);
}

const PipelineExecutor& Trainer::training_pipeline(int64_t num_micro) {
  auto it = train_pipelines_.find(num_micro);
  if (it == train_pipelines_.end())
    it = train_pipelines_.try_emplace(num_micro, training_schedule(args_, num_micro),
                                      groups_.pp ? groups_.pp->rank() : 0).first;
  return it->second;
}

int64_t Trainer::load_global_batch(BatchLoader& loader, int64_t consumed, bool training) {
  const int64_t num_micro = training ? args_.num_microbatches_at(consumed) : layout_.num_microbatches;
  const std::vector<int32_t>& samples = loader.global_batch(consumed);
  for (int64_t m = 0; m < num_micro; ++m) load_micro_batch(samples, m);
  return num_micro;
}

void Trainer::run_global_batch(int64_t num_micro, bool training, double loss_scale) {
  fill_zero(loss_sums_);
  auto compute = [&](const PipeAction& a, SlotRef slot) {
    const MicroBatch& mb = batches_[a.micro];
    // Dropout masks are keyed by the sample's index within the global batch.
    const StepContext step{static_cast<uint32_t>(iteration_),
                           static_cast<uint32_t>(layout_.sample_index(0, a.micro, 0)), training,
                           loss_scale / static_cast<double>(num_micro), iteration_scalar_,
                           training && a.micro + 1 == num_micro};
    if (a.op == PipeOp::Forward) {
      model_.forward(a.chunk, slot, mb, step, loss_sums_);
      return;
    }
    // Megatron's default: the gradient of the mean over micro-batches of each micro-batch's
    // token-mean loss; times CP as Megatron's loss_func, since the gradients are averaged
    // over DP x CP ranks that each hold part of the micro-batch's tokens.
    const float weight = static_cast<float>(loss_scale * args_.context_parallel_size /
                                            (mask_sums_[a.micro] * static_cast<double>(num_micro)));
    if (dp_buckets_ && a.micro + 1 == num_micro)
      model_.backward(a.chunk, slot, mb, step, weight,
                      [&](size_t first, size_t end) { dp_buckets_->mark_ready(first, end); });
    else
      model_.backward(a.chunk, slot, mb, step, weight);
  };
  (training ? training_pipeline(num_micro) : eval_pipeline_).run(model_, if_split(groups_.pp), compute);
  if (training) finalize_grads();
}

// Masked loss and mask sums (zero but on the stage with the loss) over the replicas, then
// from the last stage to every stage.
std::pair<double, double> Trainer::global_loss_sums(const double* host_sums) {
  std::vector<double> sums(host_sums, host_sums + 2);
  sum_in_rank_order(dp_, sums);
  if (Communicator* pp = if_split(groups_.pp))
    pp->broadcast(Tensor(sums.data(), DType::I64, {2}, nullptr), pp->size() - 1);
  return {sums[0], sums[1]};
}

// Megatron's finalize_model_grads: data-parallel averaging, then the sequence-parallel
// replicated gradients summed over TP, then the tied embedding's two copies summed.
// With the distributed optimizer the sums run on the owned pieces: every TP rank lays out
// its buffer alike, and the shared embedding sits in a bucket of its own on both stages, so
// the ranks of each group own the same piece (or all none, and skip the call alike).
void Trainer::finalize_grads() {
  if (dp_buckets_) dp_buckets_->finish();
  const std::vector<ParamShard>& shards = model_.shards();
  if (Communicator* tp = if_split(groups_.tp))
    for (size_t i = 0; i < shards.size(); ++i)
      if (shards[i].grad_sums_over_tp && !main_grads_[i].empty()) tp->all_reduce(main_grads_[i], ReduceOp::Sum);
  if (Communicator* emb = if_split(groups_.embedding))
    for (size_t i = 0; i < shards.size(); ++i)
      if (shards[i].spec.name == "embedding.word_embeddings.weight" && !args_.model.untie_embeddings_and_output_weights &&
          !main_grads_[i].empty())
        emb->all_reduce(main_grads_[i], ReduceOp::Sum);
}

// The slab of doubles (loss sums, norm slots, norm result: the span read back each step),
// then the norm's chunk tables and their workspace: every buffer the step's norm uses,
// and the iteration as a device scalar for the dropout masks, allocated once here (the
// static plan; the step allocates nothing).
void Trainer::build_norm_tables() {
  // Norm slots per (parameter, TP rank), and over owned pieces per DP rank.
  const int64_t slots = static_cast<int64_t>(gpt_param_specs(args_.model).size()) * args_.tensor_parallel_size *
                        (norm_over_pieces() ? args_.data_parallel_with_cp() : 1);
  // Each counted gradient is one segment, grouped by the buffer it lives in.
  std::map<void*, std::vector<ops::MultiTensorSegment>> segments;
  std::vector<Tensor> buffers;
  int64_t most_rows = 0;
  const std::vector<int64_t> squares_slots = squared_in_backward();
  for (size_t i = 0; i < model_.shards().size(); ++i) {
    const Tensor& g = norm_grad(i);
    if (!counts_in_norm(i) || g.empty() || squares_slots[i] >= 0) continue;
    TESSERA_CHECK(g.dtype == DType::F32, "the gradients are f32");
    if (!segments.count(g.handle)) buffers.push_back(g);
    ops::MultiTensorSegment seg;
    seg.grad = static_cast<int64_t>(g.offset / sizeof(float));
    seg.numel = g.numel();
    seg.slot = static_cast<int64_t>(norm_slot(i));
    segments[g.handle].push_back(seg);
  }
  std::vector<std::vector<int64_t>> tables;
  SlabBuilder layout;
  const size_t loss_at = layout.reserve(DType::I64, {2});
  const size_t norm_at = layout.reserve(DType::I64, {slots});
  const size_t result_at = layout.reserve(DType::I64, {2});
  const size_t span = result_at + 2 * sizeof(double);
  std::vector<size_t> table_at;
  std::vector<int64_t> ends;
  for (const Tensor& b : buffers) {
    int64_t end = 0;
    for (const ops::MultiTensorSegment& seg : segments[b.handle]) end = std::max(end, seg.grad + seg.numel);
    ends.push_back(end);
    tables.push_back(ops::multi_tensor_chunk_table(segments[b.handle]));
    const int64_t rows = static_cast<int64_t>(tables.back().size()) / ops::kChunkColumns;
    most_rows = std::max(most_rows, rows);
    table_at.push_back(layout.reserve(DType::I64, {rows, ops::kChunkColumns}));
  }
  const Shape workspace = ops::multi_tensor_sum_squares_workspace(device_, most_rows);
  const size_t workspace_at = layout.reserve(DType::I64, workspace);
  const size_t iteration_at = layout.reserve(DType::I32, {1});
  scalars_slab_ = Buffer(device_, layout.total_bytes());
  iteration_scalar_ = tensor_at(scalars_slab_, iteration_at, DType::I32, {1});
  loss_sums_ = tensor_at(scalars_slab_, loss_at, DType::I64, {2});
  norm_sums_ = tensor_at(scalars_slab_, norm_at, DType::I64, {slots});
  norm_result_ = tensor_at(scalars_slab_, result_at, DType::I64, {2});
  norm_workspace_ = tensor_at(scalars_slab_, workspace_at, DType::I64, workspace);
  step_sums_ = tensor_at(scalars_slab_, 0, DType::I64, {static_cast<int64_t>(span / sizeof(double))});
  step_host_.resize(span / sizeof(double));
  for (size_t k = 0; k < buffers.size(); ++k) {
    const int64_t rows = static_cast<int64_t>(tables[k].size()) / ops::kChunkColumns;
    const Tensor chunks = tensor_at(scalars_slab_, table_at[k], DType::I64, {rows, ops::kChunkColumns});
    copy_from_host(chunks, tables[k].data(), tables[k].size() * sizeof(int64_t));
    norm_slabs_.push_back({Tensor(buffers[k].handle, 0, DType::F32, {ends[k]}, buffers[k].device), chunks});
  }
  model_.hand_grad_squares(norm_sums_, squares_slots);
}

// The norm slot of each shard whose squares the model's backward adds as it writes the
// gradient (GPTModel::hand_grad_squares; -1: the norm pass reads it): the squarable counted
// gradients, when nothing changes them between the last backward and the norm (no
// data-parallel averaging, no sum over TP or the embedding group) and outside
// --deterministic-mode (whose norm keeps its fixed order, the same bits in every layout).
std::vector<int64_t> Trainer::squared_in_backward() const {
  std::vector<int64_t> slots(model_.shards().size(), -1);
  if (dp_ || device_.deterministic_mode()) return slots;
  for (size_t i : model_.squarable_grads()) {
    const ParamShard& s = model_.shards()[i];
    if (counts_in_norm(i) && !s.grad_sums_over_tp && !s.is_expert && !norm_grad(i).empty())
      slots[i] = static_cast<int64_t>(norm_slot(i));
  }
  return slots;
}

size_t Trainer::norm_slot(size_t i) const {
  const int tp = model_.partition().tp_size, tp_rank = model_.partition().tp_rank;
  const size_t slot = model_.shards()[i].spec.id * tp + tp_rank;
  if (!norm_over_pieces()) return slot;
  // An expert's pieces are owned over the expert data-parallel group (no larger than dp-cp).
  const bool expert = model_.partition().ep_size > 1 && model_.shards()[i].is_expert;
  const int owner = expert ? groups_.expert_dp->rank() : dp_->rank();
  return slot * static_cast<size_t>(dp_->size()) + static_cast<size_t>(owner);
}

// Under expert parallelism the EP ranks hold the same dense parameters (averaged over dp-cp)
// and different experts: without the distributed optimizer the dense ones count on EP rank 0
// only, the experts on every EP rank (Megatron sums the experts' norm over the expert
// tensor-model-pipeline group: optimizer/__init__.py's second optimizer). Over owned pieces
// each piece counts on its one owner already.
bool Trainer::counts_in_norm(size_t i) const {
  const ParamShard& s = model_.shards()[i];
  if (!s.counts_in_norm) return false;
  return norm_over_pieces() || s.is_expert || model_.partition().ep_rank == 0;
}

// Each parameter's sum of squares goes into its own slot (parameter id, TP rank), so the
// total is added in parameter order whatever the layout: pure pipeline parallelism gives
// the single process's norm to the bit. Exactly one rank fills each slot, so summing the
// slots' 64-bit patterns as integers over the group moves them without rounding. The slots
// are zeroed before the backward, filled by one multi-tensor call per gradient buffer (and,
// for the gradients of squared_in_backward, by the backward itself as it writes them) and
// summed on the device, which also derives the clipping factor (ops::grad_norm_finish); the
// host reads the result with the loss sums.
// With the distributed optimizer each data-parallel rank fills the slots of its own pieces
// (one per parameter: a parameter never spans buckets), and the slots travel over the world.
// A piece's sum of squares, though, depends on where the layout cut its parameter, so in
// --deterministic-mode every rank first gathers the whole reduced gradients into the
// gradient buffer and takes the norm as without the distributed optimizer: the same bits
// (and clipping factor) whatever the layout, for one all-gather of the gradients per step.
void Trainer::global_grad_norm() {
  if (distributed_optimizer() && !norm_over_pieces()) dp_buckets_->gather_grads();
  for (const NormSlab& n : norm_slabs_) ops::multi_tensor_sum_squares(norm_sums_, norm_workspace_, n.grad, n.chunks);
  if (Communicator* group = if_split(norm_over_pieces() ? groups_.world : groups_.model_parallel))
    group->all_reduce(norm_sums_, ReduceOp::Sum);
  if (Communicator* ep = if_split(groups_.ep); ep && !norm_over_pieces()) ep->all_reduce(norm_sums_, ReduceOp::Sum);
  ops::grad_norm_finish(norm_result_, optimizer_->step_scalars(), norm_sums_, args_.optimizer.clip_grad);
}

// The step's device work between the batch upload and the read-back. The norm is the same
// on every rank and non-finite wherever any gradient is (every gradient is counted, or
// copied from one that is), so it is also Megatron's found_inf.
void Trainer::run_step_region(int64_t num_micro, double loss_scale) {
  const auto region = [&] {
    model_.zero_grads();
    fill_zero(norm_sums_);  // before the backward, which may add to it (hand_grad_squares)
    run_global_batch(num_micro, true, loss_scale);
    global_grad_norm();
  };
  if (!step_graphs_) return region();
  // The host values the region's kernels take: the micro-batch count and, through each
  // micro-batch's loss weight, the loss scale and the mask sums.
  std::vector<double> key{static_cast<double>(num_micro), loss_scale};
  key.insert(key.end(), mask_sums_.begin(), mask_sums_.begin() + num_micro);
  step_graphs_->run(key, region);
}

void Trainer::read_step_sums() { copy_to_host(step_host_.data(), step_host_.size() * sizeof(double), step_sums_); }

IterationResult Trainer::train_step() {
  ++iteration_;
  // The dropout kernels read the iteration from the device (ops.h Dropout::iteration), so
  // the step's launches are the same every step.
  const int32_t iteration = static_cast<int32_t>(iteration_);
  copy_from_host(iteration_scalar_, &iteration, sizeof(iteration));
  IterationResult r;
  r.lr = scheduler_.lr();
  const double loss_scale = loss_scaler_ ? loss_scaler_->scale() : 1.0;
  const uint64_t reads_before = device_.host_reads();
  optimizer_->prepare_step(r.lr, scheduler_.weight_decay(), loss_scale);
  r.global_batch = args_.global_batch_at(consumed_samples_);
  const int64_t num_micro = load_global_batch(*train_loader_, consumed_samples_, true);
  run_step_region(num_micro, loss_scale);
  take_moe_metrics(r, num_micro);
  // The step's one wait for the device: the loss sums with the norm and found-inf, which
  // decide the skip (fp16 overflow, --skip-spikes, the NaN check) as Megatron's step reads
  // found_inf and the norm.
  read_step_sums();
  auto [loss_sum, mask_sum] = global_loss_sums(host_at(loss_sums_.offset));
  r.lm_loss = loss_sum / mask_sum;
  r.tokens = r.global_batch * args_.model.seq_length;
  const double* norm = host_at(norm_result_.offset);
  r.host_reads = static_cast<int64_t>(device_.host_reads() - reads_before);
  // Megatron's fp16 step (megatron/core/optimizer/optimizer.py's MixedPrecisionOptimizer):
  // an overflow in the scaled gradients skips the update, clipping and the scheduler; the
  // scaler backs off (or grows) either way.
  if (loss_scaler_) {
    const bool overflow = norm[1] != 0.0;
    loss_scaler_->update(overflow);
    r.loss_scale = loss_scaler_->scale();
    if (overflow) {
      r.skipped = true;
      r.grad_norm = std::nan("");
      consumed_samples_ += r.global_batch;
      return r;
    }
  }
  r.grad_norm = norm[0];
  if (args_.check_for_nan && (!std::isfinite(r.lm_loss) || !std::isfinite(r.grad_norm))) report_non_finite(r);
  if (args_.skip_spikes > 0) {
    // The same values on every replica, so every replica decides alike.
    r.skipped = loss_window_.z(r.lm_loss) > args_.skip_spikes || grad_norm_window_.z(r.grad_norm) > args_.skip_spikes;
    loss_window_.push(r.lm_loss);
    grad_norm_window_.push(r.grad_norm);
  }
  if (!r.skipped) {
    // Unscaling folds into the clipping factor grad_norm_finish left on the device: one
    // pass over the gradients, which also writes the 16-bit parameters.
    optimizer_->step();
    if (distributed_optimizer()) dp_buckets_->gather_params();
    scheduler_.step(r.global_batch);
  }
  consumed_samples_ += r.global_batch;  // consumed even when skipped, as Megatron counts
  return r;
}

// Megatron's reduce_aux_losses_tracker_across_ranks and track_moe_metrics' scale: each MoE
// layer's losses, summed over the pipeline stages (a layer's values live on the one stage
// that holds it, zeros elsewhere, so adding the 64-bit patterns as integers moves them
// exactly), times 1 / micro-batches. Every tensor-parallel rank routed the whole sequence
// alike; as in Megatron, the data-parallel replicas are not averaged (the last rank logs its
// own).
void Trainer::take_moe_metrics(IterationResult& r, int64_t num_micro) {
  if (!args_.model.moe.enabled()) return;
  MoELossTracker t = model_.take_moe_losses();
  if (Communicator* pp = if_split(groups_.pp)) {
    pp->all_reduce(Tensor(t.load_balancing.data(), DType::I64, {static_cast<int64_t>(t.load_balancing.size())}, nullptr),
                   ReduceOp::Sum);
    pp->all_reduce(Tensor(t.z.data(), DType::I64, {static_cast<int64_t>(t.z.size())}, nullptr), ReduceOp::Sum);
  }
  for (double& v : t.load_balancing) v /= static_cast<double>(num_micro);
  for (double& v : t.z) v /= static_cast<double>(num_micro);
  r.moe_load_balancing = std::move(t.load_balancing);
  r.moe_z = std::move(t.z);
}

// Stops the run before the update touches the weights (and before any save), naming the
// iteration, the rank and the first parameter whose gradient is not finite (by its slot of
// this step's norm, which only this rank filled).
void Trainer::report_non_finite(const IterationResult& r) const {
  std::string what = std::isfinite(r.lm_loss) ? "gradient" : "loss (" + std::to_string(r.lm_loss) + ")";
  for (size_t i = 0; i < model_.shards().size(); ++i) {
    const ParamShard& s = model_.shards()[i];
    if (counts_in_norm(i) && !norm_grad(i).empty() && !std::isfinite(host_at(norm_sums_.offset)[norm_slot(i)])) {
      what += std::isfinite(r.lm_loss) ? " of " : ", first non-finite gradient in ";
      what += model_.shards()[i].spec.name;
      break;
    }
  }
  throw runtime_error("non-finite " + what + " at iteration " + std::to_string(iteration_) + " on rank " +
                          std::to_string(log_rank()) + "; the weights were not updated and no checkpoint was written",
                      "lower --lr, raise --lr-warmup-iters, tighten --clip-grad, or check the data; "
                      "resume from the last checkpoint with --load");
}

double Trainer::evaluate(const char* split) {
  const bool valid = std::string_view(split) == "validation";
  BatchLoader* loader = valid ? valid_loader_.get() : test_loader_.get();
  TESSERA_CHECK(loader != nullptr, std::string("no ") + split + " split");
  int64_t consumed = valid ? consumed_valid_samples_ : 0;
  double loss_sum = 0.0, mask_sum = 0.0;
  for (int i = 0; i < args_.eval_iters; ++i) {
    run_global_batch(load_global_batch(*loader, consumed, false), false);
    double host_sums[2];
    copy_to_host(host_sums, sizeof(host_sums), loss_sums_);
    auto [l, m] = global_loss_sums(host_sums);
    loss_sum += l;
    mask_sum += m;
    consumed += args_.global_batch_size;
  }
  if (valid) consumed_valid_samples_ = consumed;
  return loss_sum / mask_sum;
}

// The scalars Megatron's training_log writes, under its tag names, each also against the
// consumed samples ("... vs samples").
void Trainer::write_tensorboard(const IterationResult& r) {
  auto both = [&](const std::string& tag, double value) {
    tensorboard_->add_scalar(tag, value, iteration_);
    tensorboard_->add_scalar(tag + " vs samples", value, consumed_samples_);
  };
  both("learning-rate", r.lr);
  both("batch-size", static_cast<double>(r.global_batch));
  if (!r.skipped) both("lm loss", r.lm_loss);
  write_moe_tensorboard("load_balancing_loss", r.moe_load_balancing);
  write_moe_tensorboard("z_loss", r.moe_z);
  if (args_.log_loss_scale_to_tensorboard) both("loss-scale", r.loss_scale);
  tensorboard_->add_scalar("world-size", log_world_size(), iteration_);
  if (!r.skipped && args_.optimizer.clip_grad > 0) both("grad-norm", r.grad_norm);
  if (args_.log_memory_to_tensorboard) {
    tensorboard_->add_scalar("mem-allocated-bytes", static_cast<double>(device_.allocated_bytes()), iteration_);
    tensorboard_->add_scalar("mem-max-allocated-bytes", static_cast<double>(device_.peak_allocated_bytes()),
                             iteration_);
  }
}

// track_moe_metrics' scalars: the mean over layers, and with --moe-per-layer-logging each layer's.
void Trainer::write_moe_tensorboard(const std::string& name, const std::vector<double>& layers) {
  double sum = 0;
  for (double v : layers) sum += v;
  if (layers.empty() || sum == 0) return;  // no such loss in this run
  tensorboard_->add_scalar(name, sum / static_cast<double>(layers.size()), iteration_);
  if (args_.moe_per_layer_logging)
    for (size_t l = 0; l < layers.size(); ++l)
      tensorboard_->add_scalar("moe/" + name + "_layer_" + std::to_string(l), layers[l], iteration_);
}

// Megatron's validation block (evaluate_and_print_results in megatron/training/training.py).
void Trainer::print_evaluation(const std::string& prefix, const char* split) {
  const double loss = evaluate(split);
  if (tensorboard_) {
    const std::string tag = std::string("lm loss ") + split;
    tensorboard_->add_scalar(tag, loss, iteration_);
    tensorboard_->add_scalar(tag + " vs samples", loss, consumed_samples_);
    if (args_.log_validation_ppl_to_tensorboard) {
      tensorboard_->add_scalar(tag + " ppl", std::exp(std::min(20.0, loss)), iteration_);
      tensorboard_->add_scalar(tag + " ppl vs samples", std::exp(std::min(20.0, loss)), consumed_samples_);
    }
    tensorboard_->flush();
  }
  char buf[256];
  std::snprintf(buf, sizeof(buf), " validation loss at %s | lm loss value: %.6E | lm loss PPL: %.6E | ", prefix.c_str(),
                loss, std::exp(std::min(20.0, loss)));
  const std::string dashes(std::strlen(buf) + 1, '-');
  print_rank_last("%s\n%s\n%s", dashes.c_str(), buf, dashes.c_str());
}

// Megatron's three ways to stop early; the time and signal conditions are agreed across the
// replicas (any one of them stops all), so that every rank saves and leaves together.
const char* Trainer::exit_reason(std::chrono::steady_clock::time_point start) {
  if (args_.exit_interval > 0 && iteration_ % args_.exit_interval == 0) return "--exit-interval";
  if (args_.exit_duration_minutes <= 0 && !args_.exit_signal_handler) return nullptr;
  const double minutes = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() / 60.0;
  int32_t flags[2] = {args_.exit_duration_minutes > 0 && minutes >= args_.exit_duration_minutes,
                      args_.exit_signal_handler && exit_signal_received()};
  if (Communicator* world = if_split(groups_.world))
    world->all_reduce(Tensor(flags, DType::I32, {2}, nullptr), ReduceOp::Max);
  if (flags[1]) return "--exit-signal-handler: signal received";
  if (flags[0]) return "--exit-duration-in-mins";
  return nullptr;
}

void Trainer::train() {
  using clock = std::chrono::steady_clock;
  const auto train_start = clock::now();
  auto interval_start = clock::now();
  double loss_sum = 0.0;
  int64_t tokens = 0;
  int advanced = 0, skipped = 0;
  while (iteration_ < args_.train_iters) {
    IterationResult r = train_step();
    if (r.skipped) {
      ++skipped;
    } else {
      loss_sum += r.lm_loss;
      ++advanced;
    }
    auto mean = [](const std::vector<double>& v) {
      double sum = 0;
      for (double x : v) sum += x;
      return v.empty() ? 0.0 : sum / static_cast<double>(v.size());
    };
    moe_load_balancing_sum_ += mean(r.moe_load_balancing);
    moe_z_sum_ += mean(r.moe_z);
    tokens += r.tokens;
    if (tensorboard_ && iteration_ % args_.tensorboard_log_interval == 0) write_tensorboard(r);
    if (iteration_ % args_.log_interval == 0) {
      const double elapsed = std::chrono::duration<double>(clock::now() - interval_start).count();
      log_line(r, loss_sum, advanced, skipped, elapsed, tokens);
      loss_sum = 0.0;
      tokens = 0;
      advanced = skipped = 0;
      interval_start = clock::now();
    }
    if (valid_loader_ && args_.eval_iters > 0 && args_.eval_interval > 0 && iteration_ % args_.eval_interval == 0) {
      print_evaluation("iteration " + std::to_string(iteration_), "validation");
      interval_start = clock::now();  // evaluation time is not training time
    }
    const bool saved = !args_.save.empty() && iteration_ % args_.save_interval == 0;
    if (saved) {
      save_checkpoint(args_.save);
      interval_start = clock::now();  // nor is checkpoint time
    }
    if (const char* why = exit_reason(train_start)) {
      if (!args_.save.empty() && !saved) save_checkpoint(args_.save);
      print_rank_0("exiting program at iteration %lld (%s)", static_cast<long long>(iteration_), why);
      return;
    }
  }
  // Megatron saves at the end unless the last iteration just did.
  if (!args_.save.empty() && iteration_ % args_.save_interval != 0) save_checkpoint(args_.save);
  if (valid_loader_ && args_.eval_iters > 0)
    print_evaluation("iteration " + std::to_string(iteration_) + " on validation set", "validation");
  if (test_loader_ && args_.eval_iters > 0)
    print_evaluation("iteration " + std::to_string(iteration_) + " on test set", "test");
}

std::string memory_report_line(int rank, int64_t iterations, const Device& device) {
  struct rusage usage {};
  getrusage(RUSAGE_SELF, &usage);
  const std::string allocated = python_float_repr(device.allocated_bytes() / 1048576.0);
  const std::string peak = python_float_repr(device.peak_allocated_bytes() / 1048576.0);
  return "[Rank " + std::to_string(rank) + "] (after " + std::to_string(iterations) +
         " iterations) memory (MB) | allocated: " + allocated + " | max allocated: " + peak +
         " | reserved: " + allocated + " | max reserved: " + peak +
         " | peak resident: " + python_float_repr(usage.ru_maxrss / 1024.0);
}

// Megatron's training log line (training_log in megatron/training/training.py) with tokens/s
// after its last field.
// lm loss is the mean over the iterations that advanced; skipped ones are counted instead.
void Trainer::log_line(const IterationResult& last, double loss_sum, int advanced, int skipped, double elapsed_s,
                       int64_t tokens) {
  const double ms_per_iter = elapsed_s * 1000.0 / (advanced + skipped);
  const double lm_loss = advanced > 0 ? loss_sum / advanced : 0.0;
  const double lr_next = scheduler_.lr();
  const double tokens_per_s = tokens / elapsed_s;
  std::string line = " [" + timestamp() + "]";
  char buf[256];
  std::snprintf(buf, sizeof(buf), " iteration %8lld/%8lld |", static_cast<long long>(iteration_),
                static_cast<long long>(args_.train_iters));
  line += buf;
  std::snprintf(buf, sizeof(buf), " consumed samples: %12lld |", static_cast<long long>(consumed_samples_));
  line += buf;
  std::snprintf(buf, sizeof(buf), " elapsed time per iteration (ms): %.1f |", ms_per_iter);
  line += buf;
  // Megatron's formula (num_floating_point_operations in megatron/training/training.py), per
  // device: the world shares the iteration.
  const double tflops_per_device =
      megatron_flops_per_iteration(args_, last.global_batch) / (ms_per_iter / 1000.0 * 1e12) / log_world_size();
  if (args_.log_throughput) {
    // Megatron's one decimal reads 0.0 on a CPU: below 10, three significant digits (trailing zeros kept: 0.00780).
    if (tflops_per_device >= 10)
      std::snprintf(buf, sizeof(buf), " throughput per GPU (TFLOP/s/GPU): %.1f |", tflops_per_device);
    else
      std::snprintf(buf, sizeof(buf), " throughput per GPU (TFLOP/s/GPU): %#.3g |", tflops_per_device);
    line += buf;
  }
  std::snprintf(buf, sizeof(buf), " learning rate: %.6E |", lr_next);
  line += buf;
  std::snprintf(buf, sizeof(buf), " global batch size: %5lld |", static_cast<long long>(last.global_batch));
  line += buf;
  if (lm_loss > 0) {
    std::snprintf(buf, sizeof(buf), " lm loss: %.6E |", lm_loss);
    line += buf;
  }
  // Megatron's total_loss_dict entries from track_moe_metrics, averaged over the advanced
  // iterations and printed when positive.
  const double lb_loss = moe_load_balancing_sum_ / std::max(1, advanced), z_loss = moe_z_sum_ / std::max(1, advanced);
  moe_load_balancing_sum_ = moe_z_sum_ = 0;
  for (auto [name, value] : {std::pair{"load_balancing_loss", lb_loss}, std::pair{"z_loss", z_loss}})
    if (value > 0) {
      std::snprintf(buf, sizeof(buf), " %s: %.6E |", name, value);
      line += buf;
    }
  std::snprintf(buf, sizeof(buf), " loss scale: %.1f |", last.loss_scale);
  line += buf;
  if (args_.optimizer.clip_grad > 0 && !last.skipped) {
    std::snprintf(buf, sizeof(buf), " grad norm: %.3f |", last.grad_norm);
    line += buf;
  }
  std::snprintf(buf, sizeof(buf), " number of skipped iterations: %3d | number of nan iterations:   0 |", skipped);
  line += buf;
  std::snprintf(buf, sizeof(buf), " tokens per second: %.1f |", tokens_per_s);
  line += buf;
  if (args_.log_throughput) {
    if (const std::optional<DevicePeak> peak = device_peak(device_.name(), args_)) {
      std::snprintf(buf, sizeof(buf), " MFU: %.1f%% of %s |", 100.0 * tflops_per_device / peak->tflops,
                    peak->label.c_str());
      line += buf;
    } else if (!unknown_peak_noted_) {
      unknown_peak_noted_ = true;
      print_rank_last("MFU: unknown peak for device %s (set --peak-tflops-per-device to have MFU on every line)",
                      device_.name().c_str());
    }
  }
  print_rank_last("%s", line.c_str());
  if (tensorboard_) {
    if (args_.log_throughput) tensorboard_->add_scalar("throughput", tflops_per_device, iteration_);
    tensorboard_->add_scalar("tokens-per-second", tokens_per_s, iteration_);
    tensorboard_->flush();
  }

  if (log_json_) {
    nlohmann::json j = {{"iteration", iteration_},        {"consumed_samples", consumed_samples_},
                        {"lm_loss", lm_loss},             {"grad_norm", last.grad_norm},
                        {"learning_rate", lr_next},       {"loss_scale", last.loss_scale},
                        {"elapsed_ms_per_iteration", ms_per_iter}, {"tokens_per_second", tokens_per_s},
                        {"skipped_iterations", skipped},  {"nan_iterations", 0},
                        {"allocated_bytes", device_.allocated_bytes()}, {"host_reads", last.host_reads}};
    if (lb_loss > 0) j["load_balancing_loss"] = lb_loss;
    if (z_loss > 0) j["z_loss"] = z_loss;
    // The data-parallel reductions and gathers the step waited for (bench/distributed_optimizer_bench.sh).
    if (dp_buckets_) {
      j["dp_comm_ms_per_iteration"] =
          (dp_buckets_->exposed_seconds() - dp_exposed_logged_s_) * 1000.0 / (advanced + skipped);
      dp_exposed_logged_s_ = dp_buckets_->exposed_seconds();
    }
    std::fprintf(log_json_.get(), "%s\n", j.dump().c_str());
    std::fflush(log_json_.get());
  }
}

}  // namespace tessera
