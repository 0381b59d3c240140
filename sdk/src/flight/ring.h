#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <vector>

#include "sdk/src/core/record.h"

namespace tensortap::detail {

/// A record the flight recorder holds: what it is and all its bytes.
struct HeldRecord {
  Record record;
  std::string bytes;
};

/// The flight recorder's memory: the full records of the last `k` sampled
/// steps before the newest one, and the newest one, within a byte budget.
/// Used from the writer thread only.
class FlightRing {
 public:
  FlightRing(std::int64_t k, std::size_t budget) : k_(k), budget_(budget) {}

  /// Keeps `record`. A new step lets the oldest steps go, so that at most
  /// `k` remain before it, and then as many more as the budget needs.
  /// Returns false, keeping nothing, if `record` does not fit even alone
  /// with its own step's records.
  bool hold(HeldRecord record);
  /// Takes out the records to dump for a trigger at `step`: those of the
  /// `k` newest held steps before `step` and of every step from `step` on,
  /// oldest first. The ring is empty afterwards.
  std::vector<HeldRecord> take(std::int64_t step);
  /// The held steps, oldest first.
  std::vector<std::int64_t> steps() const;

 private:
  struct Step {
    std::int64_t step = 0;
    std::size_t bytes = 0;
    std::vector<HeldRecord> records;
  };
  void drop_oldest();
  std::int64_t k_;
  std::size_t budget_;
  std::size_t bytes_ = 0;
  std::deque<Step> steps_;  // by step, ascending
};

}  // namespace tensortap::detail
