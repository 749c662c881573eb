#include "tessera/optim/loss_scaler.h"

#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>
#include <string>

#include "tessera/core/error.h"

namespace tessera {
namespace {
// Hard-coded in Megatron's get_megatron_optimizer (megatron/core/optimizer/__init__.py).
constexpr float kGrowthFactor = 2.0f;
constexpr float kBackoffFactor = 0.5f;
}  // namespace

LossScaler::LossScaler(const LossScalerConfig& config)
    : config_(config),
      scale_(static_cast<float>(config.dynamic ? config.initial_scale : config.static_scale)),
      hysteresis_tracker_(config.hysteresis) {
  if (!config.dynamic) {
    if (!(config.static_scale > 0.0))
      throw usage_error("--loss-scale must be > 0, got " + std::to_string(config.static_scale));
    return;
  }
  if (!(config.initial_scale > 0.0))
    throw usage_error("--initial-loss-scale must be > 0, got " + std::to_string(config.initial_scale));
  if (!(config.min_scale > 0.0))
    throw usage_error("--min-loss-scale must be > 0, got " + std::to_string(config.min_scale));
  if (config.min_scale > config.initial_scale)
    throw usage_error("--min-loss-scale (" + std::to_string(config.min_scale) +
                      ") must not exceed --initial-loss-scale (" +
                      std::to_string(config.initial_scale) + ")");
  if (config.window <= 0)
    throw usage_error("--loss-scale-window must be > 0, got " + std::to_string(config.window));
  if (config.hysteresis <= 0)
    throw usage_error("--hysteresis must be > 0, got " + std::to_string(config.hysteresis));
}

void LossScaler::update(bool found_inf) {
  if (!config_.dynamic) return;
  if (found_inf) {
    growth_tracker_ = 0;
    hysteresis_tracker_ -= 1;
    // Not reset here: after the first backoff every further inf halves again.
    if (hysteresis_tracker_ <= 0)
      scale_ = std::max(scale_ * kBackoffFactor, static_cast<float>(config_.min_scale));
    return;
  }
  growth_tracker_ += 1;
  if (growth_tracker_ == config_.window) {
    growth_tracker_ = 0;
    hysteresis_tracker_ = config_.hysteresis;
    scale_ = scale_ * kGrowthFactor;
  }
}

nlohmann::json LossScaler::state_dict() const {
  return {{"scale", static_cast<double>(scale_)},
          {"growth_tracker", growth_tracker_},
          {"hysteresis_tracker", hysteresis_tracker_}};
}

void LossScaler::load_state_dict(const nlohmann::json& state) {
  if (!config_.dynamic) return;
  auto number = [&](const char* key) -> const nlohmann::json& {
    if (!state.is_object() || !state.contains(key) || !state.at(key).is_number())
      throw runtime_error(std::string("loss scaler state: \"") + key + "\" is missing or not a number",
                          "the checkpoint's optimizer state is damaged or from another program");
    return state.at(key);
  };
  const double scale = number("scale").get<double>();
  if (!(scale > 0.0) || !std::isfinite(scale))
    throw runtime_error("loss scaler state: \"scale\" must be a finite number > 0, got " +
                        std::to_string(scale));
  const auto& growth = number("growth_tracker");
  const auto& hysteresis = number("hysteresis_tracker");
  if (!growth.is_number_integer() || !hysteresis.is_number_integer())
    throw runtime_error("loss scaler state: the trackers must be integers");
  scale_ = static_cast<float>(scale);
  growth_tracker_ = growth.get<int>();
  hysteresis_tracker_ = hysteresis.get<int>();
}

}  // namespace tessera
