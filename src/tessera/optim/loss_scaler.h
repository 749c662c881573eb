// Megatron's loss scalers for fp16 training (megatron/core/optimizer/grad_scaler.py). The
// loss is multiplied by scale() before backward and the gradients by 1/scale() after it;
// update(found_inf) runs once per iteration, also on skipped ones.
//   dynamic:  an inf/NaN resets the growth counter and decrements the hysteresis counter;
//             once that is <= 0 every inf halves the scale (floored at min_scale). The
//             hysteresis counter is reset only on growth: `window` clean steps in a row double
//             the scale and reset both counters.
//   constant: --loss-scale X; scale() is X forever.
#pragma once

#include <nlohmann/json_fwd.hpp>

namespace tessera {

struct LossScalerConfig {
  bool dynamic = true;                  // false: a constant scaler (--loss-scale given)
  double initial_scale = 4294967296.0;  // --initial-loss-scale (2^32)
  double min_scale = 1.0;               // --min-loss-scale
  int window = 1000;                    // --loss-scale-window: clean steps before growth
  int hysteresis = 2;                   // --hysteresis: infs tolerated before backing off
  double static_scale = 1.0;            // --loss-scale, used when !dynamic
};

class LossScaler {
 public:
  // Checks Megatron's asserts (scales > 0, min <= initial, window and hysteresis > 0);
  // throws usage errors naming the flags.
  explicit LossScaler(const LossScalerConfig& config);

  double scale() const { return scale_; }
  double inv_scale() const { return 1.0 / scale_; }
  bool dynamic() const { return config_.dynamic; }
  int growth_tracker() const { return growth_tracker_; }
  int hysteresis_tracker() const { return hysteresis_tracker_; }

  // One iteration's outcome: whether any gradient was inf/NaN (after the all-reduce of the
  // flag). A constant scaler ignores it.
  void update(bool found_inf);

  // Checkpoint state, Megatron's state_dict keys: {"scale", "growth_tracker",
  // "hysteresis_tracker"}. A constant scaler saves its scale and ignores what it loads, as
  // Megatron's ConstantGradScaler does (the flag, not the checkpoint, sets it).
  nlohmann::json state_dict() const;
  // Throws a runtime error naming the key when the object is malformed.
  void load_state_dict(const nlohmann::json& state);

 private:
  LossScalerConfig config_;
  // float, like Megatron's scale tensor (torch.float): growth past FLT_MAX gives inf there
  // too, and saved values are the same numbers.
  float scale_;
  int growth_tracker_ = 0;
  int hysteresis_tracker_;
};

}  // namespace tessera
