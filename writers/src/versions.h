#pragma once

#include <torch/version.h>

#ifndef TENSORTAP_VERSION
#define TENSORTAP_VERSION "unknown"
#endif

namespace tensortap::detail {

/// Bumped when the layout of a run directory changes incompatibly.
constexpr int kFormatVersion = 1;
constexpr const char* kTensortapVersion = TENSORTAP_VERSION;
constexpr const char* kTorchVersion = TORCH_VERSION;

}  // namespace tensortap::detail
