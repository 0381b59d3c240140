#include "sdk/src/run/steer.h"

#include <algorithm>
#include <exception>
#include <memory>

#include <fmt/format.h>

#include <tensortap/kinds.h>

#include "sdk/src/core/pattern.h"
#include "writers/src/kind_set_access.h"

namespace tensortap::detail {
namespace {

// capture: the window of steps in full, opened or, when one runs now,
// extended to the later end. Fills `a`'s window and message, or refuses.
void apply_capture(Steering& s, const ControlRequest& r, const SteerState& state, ControlAnswer& a) {
  const std::int64_t step = state.step;
  if (state.capture_halted) {
    a.ok = false;
    a.step = -1;
    a.message = state.budget_reached
                    ? "full capture has stopped: the run reached its disk budget (Options::max_bytes)"
                    : "full capture has stopped after a flight-recorder dump (Options::after_dump)";
    return;
  }
  const std::uint64_t kinds = r.kinds != 0 ? r.kinds : state.kinds;
  // A window that runs now is extended to the later end.
  const bool extends = s.window_lo <= step && step <= s.window_hi;
  // The names either request finds: either without one, every name the
  // recorder's own include finds.
  std::string include = r.include;
  if (extends)
    include = s.window_include.empty() || r.include.empty() ? std::string()
              : s.window_include == r.include             ? r.include
                                                          : "(" + s.window_include + ")|(" + r.include + ")";
  std::shared_ptr<const Pattern> pattern;
  try {
    // Compiled here, where a refusal is an answer, and where the records
    // of the window are decided (Sampling::window_selects).
    if (!include.empty()) pattern = std::make_shared<const Pattern>(include, "include");
  } catch (const std::exception&) {
    a.ok = false;
    a.step = -1;
    a.message = extends ? "its include joined to the running capture's is more than a pattern may hold: refused"
                        : "its include is not a pattern tensortap can match: refused";
    return;
  }
  if (extends) {
    s.window_hi = std::max(s.window_hi, step + r.steps - 1);
    s.window_kinds |= kinds;
  } else {
    s.window_lo = step;
    s.window_hi = step + r.steps - 1;
    s.window_kinds = kinds;
  }
  s.window_include = std::move(include);
  s.window_pattern = std::move(pattern);
  std::string names;
  for (Kind k : kAllKinds)
    if ((s.window_kinds & KindSetAccess::bit(k)) != 0) names += std::string(names.empty() ? "" : "+") + kind_name(k);
  a.message = fmt::format("steps {}..{} in full ({}{}{})", s.window_lo, s.window_hi, names,
                          s.window_include.empty() ? "" : ", include ", s.window_include);
}

}  // namespace

std::optional<ControlAnswer> apply_request(Steering& s, const ControlRequest& r, const SteerState& state) {
  const std::int64_t step = state.step;
  const std::string& stopped = state.stopped;
  ControlAnswer a;
  a.id = r.id;
  a.command = control_command_name(r.command);
  a.ok = true;
  a.step = step;
  switch (r.command) {
    case ControlCommand::Capture:
      apply_capture(s, r, state, a);
      break;
    case ControlCommand::Every:
      s.every = r.every;
      s.every_from = step;
      // "Statistics go on" only while they do (the budget may have stopped them).
      a.message = r.every > 0 ? fmt::format("every {} steps from step {}", r.every, step)
                  : stopped.empty() ? std::string("no full tensors from now (every 0); statistics go on")
                                    : fmt::format("no full tensors from now (every 0); {}", stopped);
      break;
    case ControlCommand::Pause:
      if (s.paused_from >= 0) {
        a.message = fmt::format("already paused since step {}", s.paused_from);
        a.step = s.paused_from;
      } else {
        s.paused_from = step;
        a.message = stopped.empty()
                        ? "full tensors paused; statistics, TensorBoard, the rules and the watchdog go on"
                        : fmt::format("full tensors paused; the rules and the watchdog go on; {}", stopped);
      }
      break;
    case ControlCommand::Resume:
      a.message = s.paused_from >= 0 ? "resumed" : "not paused";
      s.paused_from = -1;
      break;
    case ControlCommand::Dump:
    case ControlCommand::Status:
      // The writer thread answers these itself.
      return std::nullopt;
  }
  return a;
}

}  // namespace tensortap::detail
