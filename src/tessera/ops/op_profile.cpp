// The op profile's totals (op_profile.h): a table indexed by op, under a mutex (taken only
// while profiling), and a per-thread nesting depth so inner calls are not counted twice.
#include "tessera/ops/op_profile.h"

#include <algorithm>
#include <ctime>
#include <mutex>

#include "tessera/ops/ops.h"

namespace tessera::ops {
namespace {

struct Totals {
  std::mutex mutex;
  std::vector<OpTime> ops;  // by OpId
};
Totals& totals() {
  static Totals t;
  return t;
}

thread_local int t_depth = 0;

double seconds(clockid_t clock) {
  timespec t;
  clock_gettime(clock, &t);
  return static_cast<double>(t.tv_sec) + 1e-9 * static_cast<double>(t.tv_nsec);
}

}  // namespace

namespace op_detail {

std::atomic<bool> g_op_profile{false};

void ProfileScope::start(OpId op) {
  entered_ = true;
  if (t_depth++ > 0) return;
  op_ = op;
  counting_ = true;
  cpu_s_ = seconds(CLOCK_PROCESS_CPUTIME_ID);
  wall_s_ = seconds(CLOCK_MONOTONIC);
}

void ProfileScope::stop() {
  --t_depth;
  if (!counting_) return;
  const double cpu = seconds(CLOCK_PROCESS_CPUTIME_ID) - cpu_s_, wall = seconds(CLOCK_MONOTONIC) - wall_s_;
  Totals& t = totals();
  std::lock_guard<std::mutex> lock(t.mutex);
  OpTime& o = t.ops[static_cast<size_t>(op_)];
  ++o.calls;
  o.cpu_ms += cpu * 1e3;
  o.wall_ms += wall * 1e3;
}

}  // namespace op_detail

void set_op_profile(bool on) {
  Totals& t = totals();
  if (on) {
    std::lock_guard<std::mutex> lock(t.mutex);
    t.ops.assign(kOpCount, OpTime{});
    for (int i = 0; i < kOpCount; ++i) t.ops[static_cast<size_t>(i)].op = static_cast<OpId>(i);
  }
  op_detail::g_op_profile.store(on, std::memory_order_relaxed);
}

std::vector<OpTime> op_profile() {
  Totals& t = totals();
  std::lock_guard<std::mutex> lock(t.mutex);
  std::vector<OpTime> called;
  for (const OpTime& o : t.ops)
    if (o.calls > 0) called.push_back(o);
  std::sort(called.begin(), called.end(), [](const OpTime& a, const OpTime& b) { return a.cpu_ms > b.cpu_ms; });
  return called;
}

}  // namespace tessera::ops
