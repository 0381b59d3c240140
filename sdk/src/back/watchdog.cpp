#include "sdk/src/back/watchdog.h"

namespace tensortap::detail {

std::optional<Dump> Watchdog::check(std::chrono::steady_clock::time_point now) {
  const std::int64_t step = clock_.step();
  if (step < 0 || step == stalled_step_ || now - clock_.since() < after_) return std::nullopt;
  stalled_step_ = step;
  Dump d;
  d.step = step;
  d.trigger = "stall";
  d.reason = "stall";
  d.last_step = step;
  d.stalled_seconds = std::chrono::duration<double>(now - clock_.since()).count();
  d.waiting = waits_.describe(now);
  return d;
}

}  // namespace tensortap::detail
