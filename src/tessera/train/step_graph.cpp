#include "tessera/train/step_graph.h"

namespace tessera {
namespace {

// Keys kept before the oldest are dropped: a run whose loss weights change every step
// (--eod-mask-loss) never replays, and must not pile up graphs.
constexpr size_t kMaxKeys = 8;

}  // namespace

StepGraphs::~StepGraphs() {
  for (const auto& [key, id] : graphs_) device_.release(id);
}

uint64_t StepGraphs::capture(const std::function<void()>& region) {
  device_.begin_capture();
  try {
    region();
  } catch (...) {
    device_.end_capture(false);
    throw;
  }
  ++captures_;
  return device_.end_capture();
}

void StepGraphs::run(const std::vector<double>& key, const std::function<void()>& region) {
  if (device_.capture_support() == Device::Capture::CheckOnly) {
    capture(region);
    return;
  }
  if (const auto it = graphs_.find(key); it != graphs_.end()) {
    if (device_.replay(it->second)) return;
    device_.release(it->second);  // memory was freed since: its addresses may be stale
    graphs_.erase(it);
  }
  if (warmed_.insert(key).second) {
    if (warmed_.size() > kMaxKeys) {
      for (const auto& [k, id] : graphs_) device_.release(id);
      graphs_.clear();
      warmed_ = {key};
    }
    region();
    return;
  }
  const uint64_t id = capture(region);
  graphs_[key] = id;
  device_.replay(id);  // the capture recorded the work without running it
}

}  // namespace tessera
