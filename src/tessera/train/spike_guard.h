// --skip-spikes Z: llm.c's outlier detector. An update whose loss or gradient norm lies more
// than Z standard deviations above the mean of the last kWindow iterations is skipped (no
// optimizer or scheduler step; the samples still count as consumed, as Megatron counts a
// skipped iteration). Until the window is full nothing is skipped.
#pragma once

#include <vector>

namespace tessera {

class ZScoreWindow {
 public:
  static constexpr int kWindow = 128;
  // The z-score of `value` against the window (NaN while the window is not yet full).
  double z(double value) const;
  void push(double value);

 private:
  std::vector<double> values_ = std::vector<double>(kWindow);
  int count_ = 0;  // values pushed so far
};

}  // namespace tessera
