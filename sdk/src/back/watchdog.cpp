#include "sdk/src/back/watchdog.h"

namespace tensortap::detail {

std::optional<Dump> Watchdog::check(std::chrono::steady_clock::time_point now) {
  const std::int64_t step = step_now_();
  if (step != seen_step_) {
    seen_step_ = step;
    seen_at_ = now;
    return std::nullopt;
  }
  if (step < 0 || step == stalled_step_ || now - seen_at_ < after_) return std::nullopt;
  stalled_step_ = step;
  Dump d;
  d.step = step;
  d.trigger = "stall";
  d.reason = "stall";
  d.last_step = step;
  d.stalled_seconds = std::chrono::duration<double>(now - seen_at_).count();
  d.waiting = waits_.describe(now);
  return d;
}

}  // namespace tensortap::detail
