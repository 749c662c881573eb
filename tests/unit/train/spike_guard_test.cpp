// llm.c's outlier detector: z-scores against the last 128 values, none before the window
// is full, the window sliding.
#include <gtest/gtest.h>

#include <cmath>

#include "tessera/train/spike_guard.h"

using tessera::ZScoreWindow;

TEST(ZScoreWindow, NothingUntilTheWindowIsFull) {
  ZScoreWindow w;
  for (int i = 0; i < ZScoreWindow::kWindow - 1; ++i) {
    w.push(i);
    EXPECT_TRUE(std::isnan(w.z(1e9)));
  }
  w.push(127);
  EXPECT_FALSE(std::isnan(w.z(0)));
}

TEST(ZScoreWindow, ZScoreOfTheLastValues) {
  ZScoreWindow w;
  // Values 0..127: mean 63.5, population variance (128^2 - 1) / 12.
  for (int i = 0; i < 128; ++i) w.push(i);
  const double sd = std::sqrt((128.0 * 128.0 - 1.0) / 12.0);
  EXPECT_NEAR(w.z(63.5 + 2 * sd), 2.0, 1e-12);
  // Sliding: after pushing 128..255 the window holds 128..255, mean 191.5.
  for (int i = 128; i < 256; ++i) w.push(i);
  EXPECT_NEAR(w.z(191.5), 0.0, 1e-12);
  EXPECT_NEAR(w.z(191.5 - sd), -1.0, 1e-12);
}
