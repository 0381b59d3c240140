#pragma once

#include <cstdint>
#include <string>

#include <tensortap/trigger.h>

namespace tensortap::detail {

/// The training health rules' parameters (python/tensortap/_doctor.py's
/// PARAMETERS, `--set <rule>.<parameter>`): which a rule has, for the
/// setters Options refuse (flight/triggers.cpp) and for what run.json's
/// "dump_on" says of each rule (run_json.cpp). One table for both.
enum TriggerParam : std::uint32_t {
  kParamKinds = 1u << 0,
  kParamInclude = 1u << 1,
  kParamThreshold = 1u << 2,
  kParamPatience = 1u << 3,
  kParamBound = 1u << 4,
  kParamNumSteps = 1u << 5,
  kParamWindow = 1u << 6,
  kParamFactor = 1u << 7,
  kParamName = 1u << 8,
  kParamMinDecrease = 1u << 9,
  kParamMinProgress = 1u << 10,
  kParamDerivative = 1u << 11,
  kParamLarge = 1u << 12,
  kParamSmall = 1u << 13,
};

/// The parameters of a rule of type `t` (0 for non_finite and when; spike's
/// name, factor and window, norm_jump's factor and window, are its
/// factory's arguments, not setters).
std::uint32_t trigger_params(Trigger::Type t);

/// A parameter's name, as the setter and `--set` spell it.
const char* trigger_param_name(TriggerParam p);

}  // namespace tensortap::detail
