#pragma once

#include <cstdint>

#include <tensortap/kinds.h>

namespace tensortap::detail {

/// A `KindSet`'s bits, one per `Kind` at its value: the sampling plan's
/// layout, kept out of the public header.
struct KindSetAccess {
  static std::uint32_t bits(const KindSet& set) { return set.bits_; }
  static std::uint32_t bit(Kind kind) { return KindSet::bit(kind); }
};

}  // namespace tensortap::detail
