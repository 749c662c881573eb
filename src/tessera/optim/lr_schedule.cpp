#include "tessera/optim/lr_schedule.h"

#include <algorithm>
#include <cmath>
#include <numbers>

#include "tessera/core/error.h"

namespace tessera {

LrScheduler::LrScheduler(const LrScheduleConfig& c) : c_(c) {
  if (c.decay_steps <= 0)
    throw usage_error("the LR decay span is empty", "set --lr-decay-iters/--train-iters (or --lr-decay-samples) > 0");
  if (c.warmup_steps >= c.decay_steps)
    throw usage_error("LR warm-up (" + std::to_string(c.warmup_steps) + " samples) must be shorter than the decay span (" +
                          std::to_string(c.decay_steps) + " samples)",
                      "lower --lr-warmup-fraction / --lr-warmup-iters / --lr-warmup-samples");
  if (c.min_lr < 0 || c.min_lr > c.max_lr)
    throw usage_error("--min-lr must satisfy 0 <= --min-lr <= --lr");
  if (c.init_lr > c.max_lr) throw usage_error("--lr-warmup-init must not exceed --lr");
  if (c.decay_style == LrDecayStyle::WSD && (c.wsd_decay_steps <= 0 || c.wsd_decay_steps > c.decay_steps))
    throw usage_error("--lr-decay-style WSD needs --lr-wsd-decay-iters (or -samples) > 0 and within the decay span");
}

double LrScheduler::lr() const {
  const double n = static_cast<double>(num_steps_);
  const double warmup = static_cast<double>(c_.warmup_steps), decay = static_cast<double>(c_.decay_steps);
  if (c_.warmup_steps > 0 && num_steps_ <= c_.warmup_steps) return c_.init_lr + (c_.max_lr - c_.init_lr) * n / warmup;
  if (c_.decay_style == LrDecayStyle::Constant) return c_.max_lr;
  if (num_steps_ > c_.decay_steps) return c_.min_lr;
  if (c_.decay_style == LrDecayStyle::InverseSquareRoot)
    return std::max(c_.min_lr, c_.max_lr * std::sqrt(std::max(warmup, 1.0)) / std::sqrt(std::max(n, 1.0)));
  const double r = (n - warmup) / (decay - warmup);
  double coeff = 0.0;
  switch (c_.decay_style) {
    case LrDecayStyle::Linear: coeff = 1.0 - r; break;
    case LrDecayStyle::Cosine: coeff = 0.5 * (std::cos(std::numbers::pi * r) + 1.0); break;
    case LrDecayStyle::WSD: {
      const double anneal_start = decay - static_cast<double>(c_.wsd_decay_steps);
      if (n <= anneal_start) {
        coeff = 1.0;
      } else {
        const double w = (n - anneal_start) / static_cast<double>(c_.wsd_decay_steps);
        switch (c_.wsd_style) {
          case WsdDecayStyle::Linear: coeff = 1.0 - w; break;
          case WsdDecayStyle::Cosine: coeff = 0.5 * (std::cos(std::numbers::pi * w) + 1.0); break;
          case WsdDecayStyle::Exponential: coeff = 2.0 * std::pow(0.5, w) - 1.0; break;
        }
      }
      break;
    }
    default: break;
  }
  return c_.min_lr + (c_.max_lr - c_.min_lr) * coeff;
}

double LrScheduler::weight_decay() const {
  if (c_.wd_style == WdIncrStyle::Constant || num_steps_ > c_.wd_incr_steps)
    return c_.wd_style == WdIncrStyle::Constant ? c_.start_wd : c_.end_wd;
  const double ratio = static_cast<double>(num_steps_) / static_cast<double>(c_.wd_incr_steps);
  const double coeff = c_.wd_style == WdIncrStyle::Linear ? ratio : 0.5 * (std::cos(std::numbers::pi * (1.0 - ratio)) + 1.0);
  return c_.start_wd + coeff * (c_.end_wd - c_.start_wd);
}

}  // namespace tessera
