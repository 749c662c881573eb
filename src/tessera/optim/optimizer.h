// The optimizer of Megatron's training step: clipping with Megatron's coefficient (the
// trainer computes the global norm across ranks), and Adam (decoupled weight decay) or SGD with momentum, over
// fp32 parameters. State (Adam moments or momentum) lives in slabs owned here.
#pragma once

#include <cstdint>
#include <vector>

#include "tessera/core/tensor.h"

namespace tessera {

class Device;

enum class OptimizerKind { Adam, SGD };

struct OptimizerConfig {
  OptimizerKind kind = OptimizerKind::Adam;
  float adam_beta1 = 0.9f, adam_beta2 = 0.999f, adam_eps = 1e-8f;
  float sgd_momentum = 0.9f;
  float clip_grad = 1.0f;  // 0 disables clipping
};

struct OptimizerParam {
  Tensor param;
  Tensor grad;
  bool weight_decay;  // weight-decay multiplier 1 or 0 (Megatron's wd_mult)
};

class Optimizer {
 public:
  Optimizer(const OptimizerConfig& config, std::vector<OptimizerParam> params, Device& device);

  // Megatron's clipping coefficient (megatron/core/optimizer/clip_grads.py):
  // clip/(norm + 1e-6) when that is < 1, else 1 (and always 1 with --clip-grad 0).
  double clip_coefficient(double norm) const;
  // One update with the scheduler's learning rate and weight decay, reading every gradient
  // multiplied by grad_scale (the clipping coefficient; the gradients stay as they are).
  void step(double lr, double weight_decay, double grad_scale = 1.0);
  int64_t steps_taken() const { return step_; }
  void set_steps_taken(int64_t steps) { step_ = steps; }
  // The state a checkpoint holds, per parameter (index into params()): Adam's "exp_avg" and
  // "exp_avg_sq", or SGD's "momentum_buffer", each shaped like its parameter. Checkpoints
  // name them "<kind>.<parameter name>" (ckpt/checkpoint.h).
  struct StateTensor {
    const char* kind;
    size_t param;
    Tensor tensor;
  };
  std::vector<StateTensor> state_tensors() const;
  const std::vector<OptimizerParam>& params() const { return params_; }

 private:
  OptimizerConfig config_;
  std::vector<OptimizerParam> params_;
  Buffer state_a_, state_b_;  // Adam: exp_avg, exp_avg_sq. SGD: momentum buffer, unused.
  std::vector<Tensor> exp_avg_, exp_avg_sq_;
  int64_t step_ = 0;
};

}  // namespace tessera
