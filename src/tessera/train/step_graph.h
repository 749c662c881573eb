// --enable-cuda-graph: the device work of a training step between the batch upload and the
// loss read-back (zeroing the gradients, every micro-batch's forward and backward, the norm),
// captured once and replayed (device.h's capture; CUDA graphs). The step's kernels read the
// per-step values that change (the iteration, the optimizer's scalars) from the device; the
// host values they still take (the micro-batch count, each micro-batch's loss weight) are the
// key: a key seen for the first time runs eagerly (its allocations, plans and kernel lookups
// happen then), the second time it is captured, then replayed. On the strict test device a
// "capture" runs the region with the capture's refusals on, every step (device.h CheckOnly).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <set>
#include <vector>

#include "tessera/device/device.h"

namespace tessera {

class StepGraphs {
 public:
  explicit StepGraphs(Device& device) : device_(device) {}
  ~StepGraphs();
  StepGraphs(const StepGraphs&) = delete;
  StepGraphs& operator=(const StepGraphs&) = delete;

  // Runs `region` for `key`: eagerly, captured, or as a replay of its capture.
  void run(const std::vector<double>& key, const std::function<void()>& region);
  // Captures made so far (the log and tests).
  int64_t captures() const { return captures_; }

 private:
  // Runs region inside begin/end_capture; the recording's id (0 on a CheckOnly device).
  uint64_t capture(const std::function<void()>& region);

  Device& device_;
  std::map<std::vector<double>, uint64_t> graphs_;
  std::set<std::vector<double>> warmed_;  // keys run eagerly once
  int64_t captures_ = 0;
};

}  // namespace tessera
