#pragma once

#include <chrono>
#include <cstdint>
#include <functional>

namespace tensortap::detail {

/// When the current step began, as the writer thread sees it: the step
/// number is the training thread's own atomic word, and the writer notes the
/// time it first sees each new one. So step() reads no clock, and the time
/// is late by at most a wake of the writer (half a second when idle). For
/// the stall watchdog and ctl's status.
class StepClock {
 public:
  /// `step_now` gives the current step, -1 before the first.
  explicit StepClock(std::function<std::int64_t()> step_now) : step_now_(std::move(step_now)) {}

  /// Writer thread, at each wake. Returns whether the step changed.
  bool tick(std::chrono::steady_clock::time_point now) {
    const std::int64_t step = step_now_();
    if (step == step_) return false;
    step_ = step;
    since_ = now;
    return true;
  }
  std::int64_t step() const { return step_; }
  /// When `step()` was first seen.
  std::chrono::steady_clock::time_point since() const { return since_; }

 private:
  const std::function<std::int64_t()> step_now_;
  std::int64_t step_ = -1;
  std::chrono::steady_clock::time_point since_{};
};

}  // namespace tensortap::detail
