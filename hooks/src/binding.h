#pragma once

#include <memory>
#include <string>

#include "sdk/src/core.h"

namespace tensortap::detail {

/// What a bound Tap needs: the recorder's core and the Tap's name.
struct TapBinding {
  std::shared_ptr<Core> core;
  std::string name;
};

/// The part of `TapImpl::forward` that runs on a step that captures.
at::Tensor tap_capture(const TapBinding& binding, at::Tensor x);

}  // namespace tensortap::detail
