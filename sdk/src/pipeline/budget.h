#pragma once

// A disk budget (Options::max_bytes, on_budget; DESIGN section 10): the
// apparent size of this rank's run directory, every file tensortap writes
// counted, kept under the budget by the writer thread.

#include <atomic>
#include <cstdint>
#include <string>

#include <tensortap/options.h>

#include "writers/src/file.h"
#include "writers/src/writer.h"

namespace tensortap::detail {

/// A full-tensor record the budget has no room for: not a failure, counted
/// as `budget_refused` (Store::begin throws it, its callers catch it).
struct BudgetRefused {};

/// What run.json's "budget" says, and `Counters::budget_refused`.
struct BudgetState {
  std::uint64_t max_bytes = 0;
  Budget policy = Budget::StopCapture;
  std::int64_t reached_at_step = -1;
  std::int64_t refused_records = 0;
  std::uint64_t refused_bytes = 0;
  std::int64_t given_up_below = -1;
};

/// Writer thread only, but `reached()` and `refused()` from any thread.
class DiskBudget {
 public:
  /// Off when `options.max_bytes()` is 0. `dir` (the rank's directory) and
  /// `writer` (its format's) must outlive it.
  DiskBudget(const Options& options, std::string run_dir, const Dir& dir, const Writer& writer);

  bool on() const { return max_ != 0; }
  /// At a batch's start: the run directory's size as it is now (the files
  /// at its top by their sizes, and what the writer holds below them).
  void measure();
  /// Before a full-tensor record of `nbytes` of step `step` is written:
  /// whether it fits. It does not: the record is refused (counted), and
  /// full capture stops from the next step on (StopCapture).
  bool admit(std::uint64_t nbytes, std::int64_t step);
  /// Whether statistics, TensorBoard's events and the lines files may still
  /// grow: under the budget and its reserve of 5%.
  bool side_files_allowed();

  /// Whether the budget stopped full capture (the front end asks at step()).
  bool reached() const { return reached_.load(std::memory_order_relaxed); }
  /// Bytes used as of the last `measure()` and admissions since (writer thread).
  std::uint64_t used() const { return used_; }
  std::int64_t refused() const { return refused_records_.load(std::memory_order_relaxed); }
  BudgetState state() const;

 private:
  const std::uint64_t max_;
  const std::uint64_t reserve_;
  const Budget policy_;
  const std::string run_dir_;
  const Dir& dir_;
  const Writer& writer_;
  // The directory's size as last measured, plus what was admitted since.
  std::uint64_t used_ = 0;
  std::atomic<bool> reached_{false};
  std::atomic<std::int64_t> reached_at_step_{-1};
  std::atomic<std::int64_t> refused_records_{0};
  std::atomic<std::uint64_t> refused_bytes_{0};
  bool said_reserve_ = false;
};

}  // namespace tensortap::detail
