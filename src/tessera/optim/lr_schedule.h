// Megatron's OptimizerParamScheduler (megatron/core/optimizer_param_scheduler.py): learning
// rate and weight decay as functions of the number of samples consumed by successful steps.
#pragma once

#include <cstdint>
#include <string>

namespace tessera {

enum class LrDecayStyle { Constant, Linear, Cosine, InverseSquareRoot, WSD };
enum class WsdDecayStyle { Linear, Cosine, Exponential };
enum class WdIncrStyle { Constant, Linear, Cosine };

struct LrScheduleConfig {
  double max_lr = 0.0;
  double min_lr = 0.0;
  double init_lr = 0.0;        // --lr-warmup-init
  int64_t warmup_steps = 0;    // samples
  int64_t decay_steps = 0;     // samples
  LrDecayStyle decay_style = LrDecayStyle::Linear;
  int64_t wsd_decay_steps = 0; // samples
  WsdDecayStyle wsd_style = WsdDecayStyle::Exponential;
  double start_wd = 0.01, end_wd = 0.01;
  int64_t wd_incr_steps = 0;   // samples
  WdIncrStyle wd_style = WdIncrStyle::Constant;
};

class LrScheduler {
 public:
  // Validates Megatron's asserts; throws usage errors naming the flags.
  explicit LrScheduler(const LrScheduleConfig& config);
  // Advances by `samples` (the global batch after each successful iteration).
  void step(int64_t samples) { num_steps_ += samples; }
  double lr() const;
  double weight_decay() const;
  int64_t num_steps() const { return num_steps_; }
  void set_num_steps(int64_t n) { num_steps_ = n; }

 private:
  LrScheduleConfig c_;
  int64_t num_steps_ = 0;
};

}  // namespace tessera
