#include "tessera/train/trainer.h"

#include <chrono>
#include <cmath>
#include <ctime>

#include <nlohmann/json.hpp>

#include "tessera/core/error.h"
#include "tessera/core/log.h"
#include "tessera/device/device.h"

namespace tessera {

namespace {

std::vector<OptimizerParam> optimizer_params(const GPTModel& model) {
  std::vector<OptimizerParam> out;
  for (size_t i = 0; i < model.specs().size(); ++i)
    out.push_back({model.params()[i], model.grads()[i], model.specs()[i].weight_decay});
  return out;
}

std::string timestamp() {
  std::time_t now = std::time(nullptr);
  char buf[32];
  std::strftime(buf, sizeof(buf), "%Y-%m-%d %H:%M:%S", std::localtime(&now));
  return buf;
}

}  // namespace

Trainer::Trainer(const TrainArgs& args, GPTModel& model, SampleSource& data, Device& device)
    : args_(args),
      model_(model),
      data_(data),
      device_(device),
      optimizer_(std::make_unique<Optimizer>(args.optimizer, optimizer_params(model), device)),
      scheduler_(args.lr_schedule) {
  const int64_t B = args.micro_batch_size, T = args.model.seq_length;
  SlabBuilder layout;
  size_t tokens = layout.reserve(DType::I32, {B, T}), positions = layout.reserve(DType::I32, {B, T});
  size_t labels = layout.reserve(DType::I32, {B, T}), mask = layout.reserve(DType::F32, {B, T});
  batch_slab_ = Buffer(device, layout.total_bytes());
  batch_ = {tensor_at(batch_slab_, tokens, DType::I32, {B, T}), tensor_at(batch_slab_, positions, DType::I32, {B, T}),
            tensor_at(batch_slab_, labels, DType::I32, {B, T}), tensor_at(batch_slab_, mask, DType::F32, {B, T})};
  sample_.resize(T + 1);
  if (!args.log_json.empty()) {
    log_json_.reset(std::fopen(args.log_json.c_str(), "a"));
    if (!log_json_) throw runtime_error("--log-json " + args.log_json + " cannot be opened for writing");
  }
}

// Megatron's get_batch: tokens = sample[:-1], labels = sample[1:], positions 0..T-1, and a
// loss mask of ones (no --eod-mask-loss yet).
void Trainer::load_micro_batch(int64_t first_sample) {
  const int64_t B = args_.micro_batch_size, T = args_.model.seq_length;
  int32_t* tokens = batch_.tokens.i32();
  int32_t* positions = batch_.positions.i32();
  int32_t* labels = batch_.labels.i32();
  float* mask = batch_.loss_mask.f32();
  for (int64_t b = 0; b < B; ++b) {
    data_.fill(first_sample + b, sample_.data());
    for (int64_t t = 0; t < T; ++t) {
      tokens[b * T + t] = sample_[t];
      labels[b * T + t] = sample_[t + 1];
      positions[b * T + t] = static_cast<int32_t>(t);
      mask[b * T + t] = 1.0f;
    }
  }
}

IterationResult Trainer::train_step() {
  ++iteration_;
  const int64_t B = args_.micro_batch_size, T = args_.model.seq_length;
  const int64_t num_micro = args_.num_microbatches();
  IterationResult r;
  r.lr = scheduler_.lr();
  model_.zero_grads();
  double loss_sum = 0.0, mask_sum = 0.0;
  for (int64_t m = 0; m < num_micro; ++m) {
    const int64_t first_in_batch = m * B;
    load_micro_batch(consumed_samples_ + first_in_batch);
    StepContext step{static_cast<uint32_t>(iteration_), static_cast<uint32_t>(first_in_batch), true};
    const double micro_loss = model_.forward(batch_, step);
    double micro_mask = 0.0;
    for (int64_t i = 0; i < B * T; ++i) micro_mask += batch_.loss_mask.f32()[i];
    // Megatron's default: the gradient of the mean over micro-batches of each
    // micro-batch's token-mean loss.
    model_.backward(batch_, step, static_cast<float>(1.0 / (micro_mask * static_cast<double>(num_micro))));
    loss_sum += micro_loss;
    mask_sum += micro_mask;
  }
  r.lm_loss = loss_sum / mask_sum;
  r.tokens = args_.global_batch_size * T;
  r.grad_norm = optimizer_->grad_norm();
  if (!std::isfinite(r.lm_loss) || !std::isfinite(r.grad_norm))
    throw runtime_error("non-finite " + std::string(std::isfinite(r.lm_loss) ? "gradient norm" : "loss") +
                            " at iteration " + std::to_string(iteration_) + " on rank 0",
                        "lower --lr, check the data, or raise --clip-grad's strictness");
  optimizer_->clip_grads(r.grad_norm);
  optimizer_->step(r.lr, scheduler_.weight_decay());
  scheduler_.step(args_.global_batch_size);
  consumed_samples_ += args_.global_batch_size;
  return r;
}

void Trainer::train() {
  using clock = std::chrono::steady_clock;
  auto interval_start = clock::now();
  double loss_sum = 0.0;
  int64_t tokens = 0;
  int iterations = 0;
  while (iteration_ < args_.train_iters) {
    IterationResult r = train_step();
    loss_sum += r.lm_loss;
    tokens += r.tokens;
    ++iterations;
    if (iteration_ % args_.log_interval == 0) {
      const double elapsed = std::chrono::duration<double>(clock::now() - interval_start).count();
      log_line(r, loss_sum, iterations, elapsed, tokens);
      loss_sum = 0.0;
      tokens = 0;
      iterations = 0;
      interval_start = clock::now();
    }
  }
}

// Megatron's training log line (megatron.md §6.1) with tokens/s after its last field.
void Trainer::log_line(const IterationResult& last, double loss_sum, int iterations, double elapsed_s, int64_t tokens) {
  const double ms_per_iter = elapsed_s * 1000.0 / iterations;
  const double lm_loss = loss_sum / iterations;
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
  if (args_.log_throughput) {
    // Megatron's formula (megatron.md §6.1) for a dense model with MHA and GELU.
    const GPTConfig& m = args_.model;
    const double Bg = static_cast<double>(args_.global_batch_size), s = m.seq_length, L = m.num_layers,
                 H = m.hidden_size;
    const double attn = (1.0 + 1.0 + s / H) * (static_cast<double>(m.kv_channels) * m.num_attention_heads / H);
    const double mlp = static_cast<double>(m.ffn_hidden_size) / H;
    const double logit = static_cast<double>(m.padded_vocab_size) / (2.0 * L * H);
    const double flops = 12.0 * Bg * s * L * H * H * (attn + mlp + logit);
    std::snprintf(buf, sizeof(buf), " throughput per GPU (TFLOP/s/GPU): %.1f |", flops / (ms_per_iter / 1000.0 * 1e12));
    line += buf;
  }
  std::snprintf(buf, sizeof(buf), " learning rate: %.6E |", lr_next);
  line += buf;
  std::snprintf(buf, sizeof(buf), " global batch size: %5lld |", static_cast<long long>(args_.global_batch_size));
  line += buf;
  if (lm_loss > 0) {
    std::snprintf(buf, sizeof(buf), " lm loss: %.6E |", lm_loss);
    line += buf;
  }
  line += " loss scale: 1.0 |";
  if (args_.optimizer.clip_grad > 0) {
    std::snprintf(buf, sizeof(buf), " grad norm: %.3f |", last.grad_norm);
    line += buf;
  }
  line += " number of skipped iterations:   0 | number of nan iterations:   0 |";
  std::snprintf(buf, sizeof(buf), " tokens per second: %.1f |", tokens_per_s);
  line += buf;
  print_rank_last("%s", line.c_str());

  if (log_json_) {
    nlohmann::json j = {{"iteration", iteration_},        {"consumed_samples", consumed_samples_},
                        {"lm_loss", lm_loss},             {"grad_norm", last.grad_norm},
                        {"learning_rate", lr_next},       {"loss_scale", 1.0},
                        {"elapsed_ms_per_iteration", ms_per_iter}, {"tokens_per_second", tokens_per_s},
                        {"skipped_iterations", 0},        {"nan_iterations", 0},
                        {"allocated_bytes", device_.allocated_bytes()}};
    std::fprintf(log_json_.get(), "%s\n", j.dump().c_str());
    std::fflush(log_json_.get());
  }
}

}  // namespace tessera
