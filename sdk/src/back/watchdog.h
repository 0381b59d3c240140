#pragma once

#include <chrono>
#include <cstdint>
#include <optional>

#include <tensortap/trigger.h>

#include "sdk/src/back/step_clock.h"
#include "sdk/src/core/waits.h"

namespace tensortap::detail {

/// The stall watchdog (Options::stall_after): when no step() has come for
/// that long, a dump with reason "stall". It reads no clock on the training
/// thread: the writer thread, which wakes at least every half second, sees
/// the step number change and notes when; so a stall is seen at most about
/// half a second late, and `stalled_seconds` is a lower bound by as much.
class Watchdog {
 public:
  /// `clock` says when the current step began; `waits` names who waits
  /// inside tensortap. Both must outlive it.
  Watchdog(std::chrono::milliseconds after, const StepClock& clock, const Waits& waits)
      : after_(after), clock_(clock), waits_(waits) {}

  /// Writer thread, at each wake, after the clock's tick: the stall's dump
  /// when one begins. Once per stall (the next needs a new step); never
  /// before the first step.
  std::optional<Dump> check(std::chrono::steady_clock::time_point now);

 private:
  const std::chrono::milliseconds after_;
  const StepClock& clock_;
  const Waits& waits_;
  std::int64_t stalled_step_ = -1;
};

}  // namespace tensortap::detail
