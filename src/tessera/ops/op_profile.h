// Per-op time, for benchmarks: while on, every op called through its dispatch (op.h) adds
// the wall time and the process's CPU time (all threads) of the call to its op's totals.
// On a shared machine the wall time follows the load and the CPU time much less so, which
// makes the CPU column the one to compare between builds. A call made inside another op's
// call is counted in the outer op only. Meaningful with one thread calling ops (one rank per
// process): in-process ranks share the process's CPU clock. Off by default; the check costs
// one relaxed atomic load per op call.
#pragma once

#include <atomic>
#include <cstdint>
#include <vector>

namespace tessera::ops {

enum class OpId : int;

struct OpTime {
  OpId op;
  int64_t calls;
  double cpu_ms, wall_ms;
};

// Starts (or stops) counting; starting clears the totals.
void set_op_profile(bool on);
// The ops called since set_op_profile(true), most CPU time first.
std::vector<OpTime> op_profile();

namespace op_detail {

extern std::atomic<bool> g_op_profile;

// Adds the time of its lifetime to op's totals when profiling is on.
class ProfileScope {
 public:
  explicit ProfileScope(OpId op) {
    if (g_op_profile.load(std::memory_order_relaxed)) start(op);
  }
  ~ProfileScope() {
    if (entered_) stop();
  }
  ProfileScope(const ProfileScope&) = delete;
  ProfileScope& operator=(const ProfileScope&) = delete;

 private:
  void start(OpId op);
  void stop();
  OpId op_{};
  bool entered_ = false, counting_ = false;  // counting_: the outermost op call of this thread
  double cpu_s_ = 0, wall_s_ = 0;
};

}  // namespace op_detail
}  // namespace tessera::ops
