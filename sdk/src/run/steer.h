#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "sdk/src/run/control_request.h"
#include "sdk/src/select/sampling.h"

namespace tensortap::detail {

/// What applying a request needs to know of the run besides the request.
struct SteerState {
  /// The step the request takes effect at (the one step() begins).
  std::int64_t step = 0;
  /// The recorder's own kinds (bits of KindSetAccess): a capture's when it
  /// names none.
  std::uint64_t kinds = 0;
  /// Full capture stopped by the flight recorder (Options::after_dump), or
  /// by the disk budget when `budget_reached`.
  bool capture_halted = false;
  bool budget_reached = false;
  /// Why statistics stopped ("" while they go on): every and pause say so.
  std::string stopped;
};

/// Applies a capture, every, pause or resume request to `s`, the cadence
/// being built for `state.step`, and returns its answer; nullopt for dump
/// and status, which the writer thread answers itself. No clock, no files,
/// no threads: FrontEnd::steer wires it to the run, and a unit test asks it
/// each command.
std::optional<ControlAnswer> apply_request(Steering& s, const ControlRequest& r, const SteerState& state);

}  // namespace tensortap::detail
