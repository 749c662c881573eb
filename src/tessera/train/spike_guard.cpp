#include "tessera/train/spike_guard.h"

#include <cmath>
#include <limits>

namespace tessera {

double ZScoreWindow::z(double value) const {
  if (count_ < kWindow) return std::numeric_limits<double>::quiet_NaN();
  double sum = 0.0, sum_sq = 0.0;
  for (double v : values_) sum += v, sum_sq += v * v;
  const double mean = sum / kWindow;
  const double var = sum_sq / kWindow - mean * mean;
  return var > 0.0 ? (value - mean) / std::sqrt(var) : 0.0;
}

void ZScoreWindow::push(double value) { values_[count_++ % kWindow] = value; }

}  // namespace tessera
