// Megatron's LR and weight-decay schedule (megatron/core/optimizer_param_scheduler.py), at
// points whose values follow from the formulas by hand.
#include <gtest/gtest.h>

#include <cmath>

#include "tessera/core/error.h"
#include "tessera/optim/lr_schedule.h"

using namespace tessera;

namespace {
LrScheduleConfig base(LrDecayStyle style) {
  LrScheduleConfig c;
  c.max_lr = 1e-3;
  c.min_lr = 1e-4;
  c.init_lr = 0.0;
  c.warmup_steps = 100;
  c.decay_steps = 1100;
  c.decay_style = style;
  c.wd_incr_steps = 1000;
  return c;
}
double lr_at(const LrScheduleConfig& c, int64_t n) {
  LrScheduler s(c);
  s.set_num_steps(n);
  return s.lr();
}
}  // namespace

TEST(LrSchedule, WarmupStartsAtInitAndIsLinear) {
  auto c = base(LrDecayStyle::Cosine);
  EXPECT_DOUBLE_EQ(lr_at(c, 0), 0.0);  // iteration 1 uses the init LR (scheduler did step(0))
  EXPECT_DOUBLE_EQ(lr_at(c, 25), 2.5e-4);
  EXPECT_DOUBLE_EQ(lr_at(c, 100), 1e-3);  // n == warmup is still the warm-up rule
  c.init_lr = 1e-4;
  EXPECT_DOUBLE_EQ(lr_at(c, 50), 1e-4 + 0.9e-3 * 0.5);
}

TEST(LrSchedule, DecayStyles) {
  // r = (n - 100) / 1000.
  EXPECT_NEAR(lr_at(base(LrDecayStyle::Linear), 600), 1e-4 + 0.9e-3 * 0.5, 1e-15);
  EXPECT_NEAR(lr_at(base(LrDecayStyle::Cosine), 600), 1e-4 + 0.9e-3 * 0.5, 1e-15);  // cos(pi/2) = 0
  EXPECT_NEAR(lr_at(base(LrDecayStyle::Cosine), 350), 1e-4 + 0.9e-3 * 0.5 * (1 + std::sqrt(0.5)), 1e-15);
  EXPECT_DOUBLE_EQ(lr_at(base(LrDecayStyle::Constant), 5000), 1e-3);
  EXPECT_DOUBLE_EQ(lr_at(base(LrDecayStyle::Linear), 1101), 1e-4);  // past the decay span
  EXPECT_NEAR(lr_at(base(LrDecayStyle::Linear), 1100), 1e-4, 1e-15);
  // inverse-square-root: max * sqrt(warmup) / sqrt(n), floored at min.
  EXPECT_NEAR(lr_at(base(LrDecayStyle::InverseSquareRoot), 400), 1e-3 * 10.0 / 20.0, 1e-15);
  EXPECT_DOUBLE_EQ(lr_at(base(LrDecayStyle::InverseSquareRoot), 1000), std::max(1e-4, 1e-3 * 10 / std::sqrt(1000.0)));
}

TEST(LrSchedule, WsdAnneal) {
  auto c = base(LrDecayStyle::WSD);
  c.wsd_decay_steps = 200;  // anneal from n = 900 to 1100
  EXPECT_DOUBLE_EQ(lr_at(c, 800), 1e-3);
  EXPECT_DOUBLE_EQ(lr_at(c, 900), 1e-3);
  EXPECT_NEAR(lr_at(c, 1000), 1e-4 + 0.9e-3 * (2 * std::pow(0.5, 0.5) - 1), 1e-15);  // exponential
  c.wsd_style = WsdDecayStyle::Linear;
  EXPECT_NEAR(lr_at(c, 1000), 1e-4 + 0.9e-3 * 0.5, 1e-15);
  c.wsd_style = WsdDecayStyle::Cosine;
  EXPECT_NEAR(lr_at(c, 950), 1e-4 + 0.9e-3 * 0.5 * (std::cos(M_PI * 0.25) + 1), 1e-15);
}

TEST(LrSchedule, WeightDecayIncrement) {
  auto c = base(LrDecayStyle::Linear);
  c.wd_style = WdIncrStyle::Linear;
  c.start_wd = 0.0;
  c.end_wd = 0.1;
  LrScheduler s(c);
  s.set_num_steps(250);
  EXPECT_NEAR(s.weight_decay(), 0.025, 1e-15);
  s.set_num_steps(2000);
  EXPECT_DOUBLE_EQ(s.weight_decay(), 0.1);
  c.wd_style = WdIncrStyle::Cosine;
  LrScheduler cs(c);
  cs.set_num_steps(500);
  EXPECT_NEAR(cs.weight_decay(), 0.05, 1e-15);
  cs.set_num_steps(250);
  EXPECT_NEAR(cs.weight_decay(), 0.1 * 0.5 * (std::cos(M_PI * 0.75) + 1), 1e-15);
}

TEST(LrSchedule, StepCountsSamples) {
  LrScheduler s(base(LrDecayStyle::Linear));
  s.step(32);
  s.step(32);
  EXPECT_EQ(s.num_steps(), 64);
  EXPECT_DOUBLE_EQ(s.lr(), 1e-3 * 64 / 100);
}

TEST(LrSchedule, MegatronAssertsBecomeUsageErrors) {
  auto c = base(LrDecayStyle::Linear);
  c.warmup_steps = 1100;
  EXPECT_THROW(LrScheduler{c}, Error);
  c = base(LrDecayStyle::Linear);
  c.min_lr = 2e-3;
  EXPECT_THROW(LrScheduler{c}, Error);
  c = base(LrDecayStyle::Linear);
  c.decay_steps = 0;
  c.warmup_steps = 0;
  EXPECT_THROW(LrScheduler{c}, Error);
}
