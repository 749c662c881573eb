#include "tessera/optim/optimizer.h"

#include <cmath>

#include "tessera/core/error.h"
#include "tessera/device/device.h"
#include "tessera/ops/ops.h"

namespace tessera {

Optimizer::Optimizer(const OptimizerConfig& config, std::vector<OptimizerParam> params, Device& device)
    : config_(config), params_(std::move(params)) {
  SlabBuilder layout, mains;
  std::vector<size_t> offsets, main_offsets;
  for (const OptimizerParam& p : params_) {
    TESSERA_CHECK(p.grad.dtype == DType::F32 && p.grad.numel() == p.param.numel(),
                  "optimizer: gradients are f32 and shaped as their parameters");
    offsets.push_back(layout.reserve(DType::F32, p.param.shape));
    main_offsets.push_back(p.param.dtype == DType::F32 ? 0 : mains.reserve(DType::F32, p.param.shape));
  }
  state_a_ = Buffer(device, layout.total_bytes());
  if (config.kind == OptimizerKind::Adam) state_b_ = Buffer(device, layout.total_bytes());
  if (mains.total_bytes() > 0) main_slab_ = Buffer(device, mains.total_bytes());
  for (size_t i = 0; i < params_.size(); ++i) {
    const OptimizerParam& p = params_[i];
    exp_avg_.push_back(tensor_at(state_a_, offsets[i], DType::F32, p.param.shape));
    if (config.kind == OptimizerKind::Adam)
      exp_avg_sq_.push_back(tensor_at(state_b_, offsets[i], DType::F32, p.param.shape));
    main_.push_back(p.param.dtype == DType::F32 ? p.param
                                                 : tensor_at(main_slab_, main_offsets[i], DType::F32, p.param.shape));
  }
  copy_params_to_main();
}

void Optimizer::copy_params_to_main() {
  for (size_t i = 0; i < params_.size(); ++i)
    if (params_[i].param.dtype != DType::F32) ops::convert(main_[i], params_[i].param);  // widening is exact
}

std::vector<const char*> Optimizer::state_kinds() const {
  if (config_.kind == OptimizerKind::Adam) return {"exp_avg", "exp_avg_sq"};
  return {"momentum_buffer"};
}

std::vector<Optimizer::StateTensor> Optimizer::state_tensors() const {
  std::vector<StateTensor> out;
  for (size_t i = 0; i < params_.size(); ++i) {
    if (config_.kind == OptimizerKind::Adam) {
      out.push_back({"exp_avg", i, exp_avg_[i]});
      out.push_back({"exp_avg_sq", i, exp_avg_sq_[i]});
    } else {
      out.push_back({"momentum_buffer", i, exp_avg_[i]});
    }
  }
  return out;
}

void Optimizer::copy_main_to_params() {
  for (size_t i = 0; i < params_.size(); ++i)
    if (params_[i].param.dtype != DType::F32) ops::convert(params_[i].param, main_[i]);
}

double Optimizer::clip_coefficient(double norm) const {
  if (config_.clip_grad <= 0.0f) return 1.0;
  const double coeff = config_.clip_grad / (norm + 1e-6);
  return coeff < 1.0 ? coeff : 1.0;
}

void Optimizer::step(double lr, double weight_decay, double grad_scale) {
  ++step_;
  for (size_t i = 0; i < params_.size(); ++i) {
    const OptimizerParam& p = params_[i];
    const float wd = p.weight_decay ? static_cast<float>(weight_decay) : 0.0f;
    if (config_.kind == OptimizerKind::Adam)
      ops::adamw_update(main_[i], p.grad, exp_avg_[i], exp_avg_sq_[i], static_cast<float>(lr), config_.adam_beta1,
                        config_.adam_beta2, config_.adam_eps, wd, step_, static_cast<float>(grad_scale));
    else
      ops::sgd_update(main_[i], p.grad, exp_avg_[i], static_cast<float>(lr), config_.sgd_momentum, wd, step_,
                      static_cast<float>(grad_scale));
  }
  copy_main_to_params();
}

}  // namespace tessera
