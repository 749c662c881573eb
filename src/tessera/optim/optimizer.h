// The optimizer of Megatron's training step: clipping with Megatron's coefficient (the
// trainer computes the global norm across ranks), and Adam (decoupled weight decay) or SGD
// with momentum, on fp32 main parameters. State (Adam moments or momentum, and the main
// parameters of 16-bit parameters) lives in slabs owned here.
//
// Main parameters (megatron/core/optimizer/optimizer.py, Float16OptimizerWithFloat16Params):
// an F32 parameter is its own main parameter, updated in place. A BF16/F16 parameter gets an
// fp32 main copy, initialised by widening its values; the update runs on the copy, and after
// each step the copy is rounded (round-to-nearest-even, as ops::convert) into the parameter, so
// a 16-bit weight is always the rounded main value. Gradients are always F32.
//
// A parameter here may be a whole tensor or any piece of one (the distributed optimizer
// passes the flat ranges this data-parallel rank owns): the update is element-wise.
//
// The update is multi-tensor (ops.h, Megatron's multi_tensor_apply): the parameters that
// share a parameter buffer and a gradient buffer (in training, all of them: the model's slabs
// or this rank's shard) form one slab, updated by one call that also rounds the main values
// into the 16-bit parameters. The step's scalars (lr, weight decay, bias corrections, loss
// scale, and the clipping factor grad_norm_finish computes on the device) live in a device
// tensor the kernels read, written once per step.
#pragma once

#include <cstdint>
#include <vector>

#include "tessera/core/tensor.h"
#include "tessera/device/buffer.h"

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
  Tensor param;  // F32, BF16 or F16
  Tensor grad;   // F32, the shape of param
  bool weight_decay;  // weight-decay multiplier 1 or 0 (Megatron's wd_mult)
};

class Optimizer {
 public:
  Optimizer(const OptimizerConfig& config, std::vector<OptimizerParam> params, Device& device);

  // Megatron's clipping coefficient (megatron/core/optimizer/clip_grads.py):
  // clip/(norm + 1e-6) when that is < 1, else 1 (and always 1 with --clip-grad 0). The
  // trainer's step computes it on the device (ops::grad_norm_finish, the same arithmetic).
  double clip_coefficient(double norm) const;
  // The step's scalars, F32 [ops::kStepScalars] on the device (ops.h StepScalar): the
  // trainer passes it to ops::grad_norm_finish, which writes the gradient factor.
  Tensor step_scalars() const { return scalars_; }
  // Writes the host part of the next update's scalars (the scheduler's learning rate and
  // weight decay, the bias corrections of step steps_taken() + 1, the loss scale): one
  // host-to-device copy, no read-back.
  void prepare_step(double lr, double weight_decay, double loss_scale);
  // One update with the prepared scalars, reading every gradient multiplied by
  // scalars[kGradScale] (the clipping coefficient over the loss scale; the gradients stay as
  // they are); the 16-bit parameters get the rounded main values in the same pass.
  void step();
  // The same with every scalar from the host: grad_scale is the gradients' factor.
  void step(double lr, double weight_decay, double grad_scale);
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
  // The kinds state_tensors() lists for each parameter, in its order.
  std::vector<const char*> state_kinds() const;
  // Parameter i's fp32 main values: the parameter itself when it is F32, else the copy.
  Tensor main_param(size_t i) const { return main_[i]; }
  // Rounds the main values into the 16-bit parameters (step() does it itself; for loads).
  void copy_main_to_params();
  // Widens the 16-bit parameters into their main copies (at construction; also for 16-bit
  // weights that arrive without their main values, such as an import).
  void copy_params_to_main();
  const std::vector<OptimizerParam>& params() const { return params_; }
  // Bytes of state allocated here (moments, momentum, main copies): what sharding divides.
  size_t state_bytes() const { return state_a_.bytes() + state_b_.bytes() + main_slab_.bytes(); }

 private:
  // One multi-tensor call: the flat tensors of a parameter buffer, its gradient buffer and
  // the main values, and the chunk table of its parameters (ops.h).
  struct Slab {
    Tensor main, param16, grad, chunks;
  };
  void build_slabs(Device& device, const std::vector<size_t>& state_offsets, const std::vector<size_t>& main_offsets);

  OptimizerConfig config_;
  std::vector<OptimizerParam> params_;
  Buffer state_a_, state_b_;  // Adam: exp_avg, exp_avg_sq. SGD: momentum buffer, unused.
  Buffer main_slab_;          // the fp32 copies of 16-bit parameters
  Buffer tables_;             // the slabs' chunk tables and the step scalars
  std::vector<Tensor> exp_avg_, exp_avg_sq_, main_;
  std::vector<Slab> slabs_;
  Tensor state_a_flat_, state_b_flat_, scalars_;
  int64_t step_ = 0;
};

}  // namespace tessera
