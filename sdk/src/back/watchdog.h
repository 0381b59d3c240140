#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <optional>

#include <tensortap/trigger.h>

#include "sdk/src/pipeline/waits.h"

namespace tensortap::detail {

/// The stall watchdog (Options::stall_after): when no step() has come for
/// that long, a dump with reason "stall". It reads no clock on the training
/// thread: the writer thread, which wakes at least every half second, sees
/// the step number change and notes when; so a stall is seen at most about
/// half a second late, and `stalled_seconds` is a lower bound by as much.
class Watchdog {
 public:
  /// `step_now` gives the current step (-1 before the first): the training
  /// thread's own atomic word, read here. `waits` names who waits inside
  /// tensortap. Both must outlive it.
  Watchdog(std::chrono::milliseconds after, std::function<std::int64_t()> step_now, const Waits& waits)
      : after_(after), step_now_(std::move(step_now)), waits_(waits) {}

  /// Writer thread, at each wake: the stall's dump when one begins. Once
  /// per stall (the next needs a new step); never before the first step.
  std::optional<Dump> check(std::chrono::steady_clock::time_point now);

 private:
  const std::chrono::milliseconds after_;
  const std::function<std::int64_t()> step_now_;
  const Waits& waits_;
  std::int64_t seen_step_ = -1;
  std::chrono::steady_clock::time_point seen_at_{};
  std::int64_t stalled_step_ = -1;
};

}  // namespace tensortap::detail
