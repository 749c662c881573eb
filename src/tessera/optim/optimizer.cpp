#include "tessera/optim/optimizer.h"

#include <cmath>

#include "tessera/device/device.h"
#include "tessera/ops/ops.h"

namespace tessera {

Optimizer::Optimizer(const OptimizerConfig& config, std::vector<OptimizerParam> params, Device& device)
    : config_(config), params_(std::move(params)) {
  SlabBuilder layout;
  std::vector<size_t> offsets;
  for (const OptimizerParam& p : params_) offsets.push_back(layout.reserve(DType::F32, p.param.shape));
  state_a_ = Buffer(device, layout.total_bytes());
  if (config.kind == OptimizerKind::Adam) state_b_ = Buffer(device, layout.total_bytes());
  for (size_t i = 0; i < params_.size(); ++i) {
    exp_avg_.push_back(tensor_at(state_a_, offsets[i], DType::F32, params_[i].param.shape));
    if (config.kind == OptimizerKind::Adam)
      exp_avg_sq_.push_back(tensor_at(state_b_, offsets[i], DType::F32, params_[i].param.shape));
  }
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
      ops::adamw_update(p.param, p.grad, exp_avg_[i], exp_avg_sq_[i], static_cast<float>(lr), config_.adam_beta1,
                        config_.adam_beta2, config_.adam_eps, wd, step_, static_cast<float>(grad_scale));
    else
      ops::sgd_update(p.param, p.grad, exp_avg_[i], static_cast<float>(lr), config_.sgd_momentum, wd, step_,
                      static_cast<float>(grad_scale));
  }
}

}  // namespace tessera
