#include "tessera/optim/optimizer.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <tuple>

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
  build_slabs(device, offsets, main_offsets);
  copy_params_to_main();
}

namespace {

int64_t elements(size_t bytes, DType t) { return static_cast<int64_t>(bytes / dtype_size(t)); }

// The flat tensor of `t`'s memory from its buffer's start to element `end`.
Tensor from_start(const Tensor& t, int64_t end) { return Tensor(t.handle, 0, t.dtype, {end}, t.device); }

}  // namespace

// Parameters that share a parameter buffer, a gradient buffer and a dtype form one slab.
void Optimizer::build_slabs(Device& device, const std::vector<size_t>& state_offsets,
                            const std::vector<size_t>& main_offsets) {
  using Key = std::tuple<void*, void*, DType>;
  std::map<Key, std::vector<size_t>> groups;
  std::vector<Key> order;
  for (size_t i = 0; i < params_.size(); ++i) {
    const Key key{params_[i].param.handle, params_[i].grad.handle, params_[i].param.dtype};
    if (!groups.count(key)) order.push_back(key);
    groups[key].push_back(i);
  }
  std::vector<std::vector<int64_t>> tables;
  SlabBuilder layout;
  std::vector<size_t> table_at;
  std::vector<int64_t> table_rows;
  for (const Key& key : order) {
    std::vector<ops::MultiTensorSegment> segments;
    int64_t param_end = 0, grad_end = 0, main_end = 0;
    for (size_t i : groups[key]) {
      const OptimizerParam& p = params_[i];
      ops::MultiTensorSegment s;
      s.param = elements(p.param.offset, p.param.dtype);
      s.grad = elements(p.grad.offset, DType::F32);
      s.state = elements(state_offsets[i], DType::F32);
      s.main = p.param.dtype == DType::F32 ? s.param : elements(main_offsets[i], DType::F32);
      s.numel = p.param.numel();
      s.decay = p.weight_decay;
      param_end = std::max(param_end, s.param + s.numel);
      grad_end = std::max(grad_end, s.grad + s.numel);
      main_end = std::max(main_end, s.main + s.numel);
      segments.push_back(s);
    }
    const OptimizerParam& first = params_[groups[key].front()];
    const bool wide = first.param.dtype == DType::F32;
    tables.push_back(ops::multi_tensor_chunk_table(segments));
    table_rows.push_back(static_cast<int64_t>(tables.back().size()) / ops::kChunkColumns);
    table_at.push_back(layout.reserve(DType::I64, {table_rows.back(), ops::kChunkColumns}));
    slabs_.push_back({wide ? from_start(first.param, main_end) : tensor_at(main_slab_, 0, DType::F32, {main_end}),
                      wide ? Tensor() : from_start(first.param, param_end), from_start(first.grad, grad_end),
                      Tensor()});
  }
  const size_t scalars_at = layout.reserve(DType::F32, {ops::kStepScalars});
  tables_ = Buffer(device, layout.total_bytes());
  for (size_t k = 0; k < slabs_.size(); ++k) {
    slabs_[k].chunks = tensor_at(tables_, table_at[k], DType::I64, {table_rows[k], ops::kChunkColumns});
    copy_from_host(slabs_[k].chunks, tables[k].data(), tables[k].size() * sizeof(int64_t));
  }
  scalars_ = tensor_at(tables_, scalars_at, DType::F32, {ops::kStepScalars});
  const int64_t state_elements = elements(state_a_.bytes(), DType::F32);
  state_a_flat_ = tensor_at(state_a_, 0, DType::F32, {state_elements});
  if (config_.kind == OptimizerKind::Adam) state_b_flat_ = tensor_at(state_b_, 0, DType::F32, {state_elements});
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

void Optimizer::prepare_step(double lr, double weight_decay, double loss_scale) {
  float host[ops::kGradScale];
  ops::step_scalars(host, lr, weight_decay, loss_scale, config_.adam_beta1, config_.adam_beta2, step_ + 1);
  copy_from_host(tensor_at(tables_, scalars_.offset, DType::F32, {ops::kGradScale}), host, sizeof(host));
}

void Optimizer::step() {
  ++step_;
  for (const Slab& s : slabs_) {
    if (config_.kind == OptimizerKind::Adam)
      ops::multi_tensor_adamw(s.main, s.param16, s.grad, state_a_flat_, state_b_flat_, s.chunks, scalars_,
                              config_.adam_beta1, config_.adam_beta2, config_.adam_eps);
    else
      ops::multi_tensor_sgd(s.main, s.param16, s.grad, state_a_flat_, s.chunks, scalars_, config_.sgd_momentum);
  }
}

void Optimizer::step(double lr, double weight_decay, double grad_scale) {
  float host[ops::kStepScalars];
  ops::step_scalars(host, lr, weight_decay, 1.0, config_.adam_beta1, config_.adam_beta2, step_ + 1);
  host[ops::kGradScale] = static_cast<float>(grad_scale);
  copy_from_host(scalars_, host, sizeof(host));
  step();
}

}  // namespace tessera
