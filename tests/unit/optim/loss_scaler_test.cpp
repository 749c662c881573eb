// Megatron's DynamicGradScaler and ConstantGradScaler (megatron/core/optimizer/grad_scaler.py),
// step by step. Each expected row follows from the rule by hand:
//   inf:   growth = 0; hysteresis -= 1; if hysteresis <= 0: scale = max(scale * 0.5, min)
//   clean: growth += 1; if growth == window: growth = 0, hysteresis = H, scale *= 2
// Scales are powers of two, so every comparison is exact.
#include <gtest/gtest.h>

#include <cmath>
#include <nlohmann/json.hpp>
#include <vector>

#include "tessera/core/error.h"
#include "tessera/optim/loss_scaler.h"

using namespace tessera;

namespace {
constexpr double k2_32 = 4294967296.0;

struct Step {
  bool found_inf;
  double scale;  // after update()
  int growth, hysteresis;
};

void run(LossScaler& s, const std::vector<Step>& steps) {
  for (size_t i = 0; i < steps.size(); ++i) {
    s.update(steps[i].found_inf);
    EXPECT_EQ(s.scale(), steps[i].scale) << "step " << i;
    EXPECT_EQ(s.growth_tracker(), steps[i].growth) << "step " << i;
    EXPECT_EQ(s.hysteresis_tracker(), steps[i].hysteresis) << "step " << i;
  }
}

LossScalerConfig dynamic(double initial, double min, int window, int hysteresis) {
  LossScalerConfig c;
  c.initial_scale = initial;
  c.min_scale = min;
  c.window = window;
  c.hysteresis = hysteresis;
  return c;
}
}  // namespace

TEST(LossScaler, DefaultsAreMegatrons) {
  LossScalerConfig c;
  EXPECT_TRUE(c.dynamic);
  EXPECT_EQ(c.initial_scale, k2_32);
  EXPECT_EQ(c.min_scale, 1.0);
  EXPECT_EQ(c.window, 1000);
  EXPECT_EQ(c.hysteresis, 2);
  LossScaler s(c);
  EXPECT_EQ(s.scale(), k2_32);
  EXPECT_EQ(s.inv_scale(), 1.0 / k2_32);
  EXPECT_EQ(s.growth_tracker(), 0);
  EXPECT_EQ(s.hysteresis_tracker(), 2);
}

TEST(LossScaler, HysteresisBackoffAndGrowthSequence) {
  LossScaler s(dynamic(k2_32, 1.0, /*window=*/3, /*hysteresis=*/2));
  const double h = k2_32 / 2, q = k2_32 / 4;
  run(s, {
      {true, k2_32, 0, 1},   // first inf is absorbed by hysteresis
      {true, h, 0, 0},       // hysteresis reaches 0: halve
      {true, q, 0, -1},      // hysteresis is not reset on backoff: halve again
      {false, q, 1, -1},
      {false, q, 2, -1},
      {false, h, 0, 2},      // 3rd clean step in a row: double, hysteresis back to 2
      {true, h, 0, 1},       // one inf tolerated again
      {false, h, 1, 1},
      {true, q, 0, 0},       // the growth counter restarted; hysteresis hits 0: halve
  });
}

TEST(LossScaler, InfInTheMiddleRestartsTheGrowthWindow) {
  LossScaler s(dynamic(1024.0, 1.0, /*window=*/3, /*hysteresis=*/5));
  run(s, {
      {false, 1024, 1, 5},
      {false, 1024, 2, 5},
      {true, 1024, 0, 4},  // no growth, counter reset
      {false, 1024, 1, 4},
      {false, 1024, 2, 4},
      {false, 2048, 0, 5},
      {false, 2048, 1, 5},
  });
}

TEST(LossScaler, GrowsAfterExactlyTheDefaultWindow) {
  LossScaler s(LossScalerConfig{});
  for (int i = 0; i < 999; ++i) s.update(false);
  EXPECT_EQ(s.scale(), k2_32);
  EXPECT_EQ(s.growth_tracker(), 999);
  s.update(false);
  EXPECT_EQ(s.scale(), 2 * k2_32);
  EXPECT_EQ(s.growth_tracker(), 0);
}

TEST(LossScaler, BackoffIsFlooredAtMinScale) {
  LossScaler s(dynamic(8.0, 3.0, /*window=*/1000, /*hysteresis=*/1));
  run(s, {
      {true, 4, 0, 0},
      {true, 3, 0, -1},  // max(2, 3)
      {true, 3, 0, -2},  // max(1.5, 3)
  });
  LossScaler at_min(dynamic(2.0, 2.0, 1000, 1));
  run(at_min, {{true, 2, 0, 0}, {true, 2, 0, -1}});
}

// Megatron keeps the scale in a float32 tensor, so growing past FLT_MAX gives inf there too.
TEST(LossScaler, ScaleIsFloat32LikeMegatrons) {
  LossScaler s(dynamic(std::ldexp(1.0, 127), 1.0, /*window=*/1, /*hysteresis=*/2));
  s.update(false);
  EXPECT_TRUE(std::isinf(s.scale()));
}

TEST(LossScaler, ConstantScalerNeverChanges) {
  LossScalerConfig c;
  c.dynamic = false;
  c.static_scale = 128.0;
  LossScaler s(c);
  EXPECT_FALSE(s.dynamic());
  for (int i = 0; i < 5; ++i) s.update(true);
  for (int i = 0; i < 2000; ++i) s.update(false);
  EXPECT_EQ(s.scale(), 128.0);
  // Like Megatron's ConstantGradScaler.load_state_dict: the flag wins over the checkpoint.
  s.load_state_dict({{"scale", 4.0}, {"growth_tracker", 1}, {"hysteresis_tracker", 1}});
  EXPECT_EQ(s.scale(), 128.0);
}

TEST(LossScaler, StateDictRoundTrip) {
  const LossScalerConfig c = dynamic(k2_32, 1.0, /*window=*/3, /*hysteresis=*/2);
  LossScaler a(c);
  for (bool inf : {true, true, false, false}) a.update(inf);
  const nlohmann::json state = a.state_dict();
  EXPECT_EQ(state, nlohmann::json({{"scale", k2_32 / 2}, {"growth_tracker", 2}, {"hysteresis_tracker", 0}}));

  LossScaler b(c);
  b.load_state_dict(nlohmann::json::parse(state.dump()));  // through text, as in a checkpoint
  EXPECT_EQ(b.state_dict(), state);
  // The restored scaler continues exactly like the original.
  for (bool inf : {false, true, false, false, false, true}) {
    a.update(inf);
    b.update(inf);
    EXPECT_EQ(a.state_dict(), b.state_dict());
  }
}

TEST(LossScaler, MalformedStateIsARuntimeError) {
  LossScaler s(LossScalerConfig{});
  const std::vector<nlohmann::json> bad = {
      nlohmann::json::array(),
      {{"growth_tracker", 0}, {"hysteresis_tracker", 2}},                        // no scale
      {{"scale", "big"}, {"growth_tracker", 0}, {"hysteresis_tracker", 2}},      // not a number
      {{"scale", 0.0}, {"growth_tracker", 0}, {"hysteresis_tracker", 2}},        // not > 0
      {{"scale", 2.0}, {"growth_tracker", 0.5}, {"hysteresis_tracker", 2}},      // not an integer
      {{"scale", 2.0}, {"growth_tracker", 0}},                                   // no hysteresis
  };
  for (const auto& state : bad) {
    EXPECT_THROW(s.load_state_dict(state), tessera::Error) << state.dump();
    EXPECT_EQ(s.state_dict()["scale"], k2_32) << "a failed load leaves the state as it was";
  }
}

TEST(LossScaler, InvalidConfigNamesTheFlag) {
  auto message = [](const LossScalerConfig& c) {
    try {
      LossScaler s(c);
    } catch (const tessera::Error& e) {
      EXPECT_EQ(e.exit_code(), 2);
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(message(dynamic(0.0, 1.0, 1000, 2)).find("--initial-loss-scale"), std::string::npos);
  EXPECT_NE(message(dynamic(8.0, 0.0, 1000, 2)).find("--min-loss-scale"), std::string::npos);
  EXPECT_NE(message(dynamic(8.0, 16.0, 1000, 2)).find("--min-loss-scale"), std::string::npos);
  EXPECT_NE(message(dynamic(8.0, 1.0, 0, 2)).find("--loss-scale-window"), std::string::npos);
  EXPECT_NE(message(dynamic(8.0, 1.0, 1000, 0)).find("--hysteresis"), std::string::npos);
  LossScalerConfig constant;
  constant.dynamic = false;
  constant.static_scale = -1.0;
  EXPECT_NE(message(constant).find("--loss-scale"), std::string::npos);
}
