#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include <tensortap/options.h>
#include <tensortap/trigger.h>

#include "sdk/src/core/failures.h"
#include "sdk/src/flight/ring.h"
#include "sdk/src/sinks/run_json.h"
#include "sdk/src/sinks/store.h"
#include "sdk/src/sinks/tensorboard.h"
#include "sdk/src/flight/triggers.h"
#include "writers/src/stats_file.h"

namespace tensortap::detail {

/// The flight recorder and the dump rules: owns the ring of held steps, the
/// rules (Options::dump_on), the window a dump opens, and what a dump means
/// for capture. The writer thread feeds it and dumps; the training thread
/// asks it, once per step, what the dumps so far mean (halt or throw).
/// Without a flight recorder (`flight_recorder(0)`) a rule that fires only
/// marks the run.
class FlightRecorder {
 public:
  /// `store`, `manifest` and `failures` must outlive it.
  FlightRecorder(const Options& options, Store& store, RunManifest& manifest, Failures& failures);

  /// Where each dump is also written as a TensorBoard text event (null: off).
  /// Before the writer thread starts.
  void set_tensorboard(TensorBoard* tensorboard) { tensorboard_ = tensorboard; }

  /// Whether full records are held (Op::Hold) rather than written.
  bool holds() const { return ring_ != nullptr; }
  /// Whether held full tensors are scanned for NaN and Inf (the non_finite
  /// rule is on).
  bool scans() const { return holds() && triggers_.checks_non_finite(); }

  // Writer thread.
  /// A record's statistics are complete: evaluates the rules (all of them
  /// on a statistics step, `has_row`; only non_finite otherwise) and dumps
  /// if one fires.
  void observe(const RecordDesc& record, const TensorStats& stats, bool has_row);
  /// A whole held record: written (inside a dump's window), held, or let
  /// go (capture stopped after a dump).
  void keep(HeldRecord record);
  /// `Recorder::dump()` was called in `step`.
  void user_dump(std::int64_t step);
  /// A dump no rule made: the stall watchdog's, a control request's. It
  /// writes the held steps (a mark once the flight recorder has stopped)
  /// and never applies Options::after_dump: no StopCapture, no Throw.
  /// Returns the dump as written: its steps, and those refused and why.
  Dump side_dump(Dump dump) { return trigger(std::move(dump), /*applies=*/false); }
  /// The nonlinearities the taps declare (watch(), any thread): the
  /// health rules judge those taps by them.
  void declare_taps(const std::vector<std::pair<std::string, std::string>>& taps) { triggers_.declare_taps(taps); }

  // Any thread.
  /// Dumps (or marks) so far, once on disk.
  std::int64_t dumps() const { return dumps_.load(std::memory_order_acquire); }
  /// Records the ring could not hold within its byte budget.
  std::int64_t dropped() const { return dropped_.load(std::memory_order_relaxed); }
  /// Whether full capture has ended: after a dump (AfterDump::StopCapture
  /// or Throw), from the step after the one that saw it, or at a disk budget
  /// (Budget::StopCapture); statistics go on. One load: the sampled path asks.
  bool capture_halted() const { return full_halted_.load(std::memory_order_relaxed); }
  /// A disk budget was reached: full capture ends (writer thread).
  void halt_full_capture() { full_halted_.store(true, std::memory_order_relaxed); }

  // Training thread, in step() (serialized by the caller).
  /// Acts on dumps since the last call: with AfterDump::Throw, throws
  /// `Error` naming the dump.
  void on_step();
  /// The dumps as of the last `on_step()` (Recorder::dumps()): copied from
  /// the manifest when asked, not at each step.
  std::vector<Dump> seen() const;
  /// After the writer thread has stopped: every dump is seen.
  void on_close();

 private:
  // A rule fired (or dump() was called): writes the held steps and opens a
  // window for what is still to come of the trigger's step. After a dump
  // that stopped the flight recorder, only marks the run (no steps): a NaN
  // after a rule's firing is still said. `applies`: after_dump acts on it.
  Dump trigger(Dump dump, bool applies = true);
  // After a dump that stops capture: later records are let go.
  bool halted() const { return halts_ && applied_.load(std::memory_order_relaxed) > 0; }

  const Options& options_;
  Store& store_;
  RunManifest& manifest_;
  Failures& failures_;
  TensorBoard* tensorboard_ = nullptr;
  Triggers triggers_;
  // Whether a dump ends full capture (a flight recorder, and not
  // AfterDump::Continue).
  const bool halts_;
  std::unique_ptr<FlightRing> ring_;
  // The window [lo, hi] of steps the last dump covers: their records still
  // to come are written, not held. Writer thread.
  std::int64_t window_lo_ = -1, window_hi_ = -1;
  std::atomic<std::int64_t> dumps_{0};
  std::atomic<std::int64_t> dropped_{0};
  // Dumps after_dump acts on (rules', Recorder::dump()'s), and the number
  // of dumps (an index + 1 of the manifest's) when the last of them was
  // made; on_step() reads the count with acquire, after which the index
  // is the last one's.
  std::atomic<std::int64_t> applied_{0};
  std::atomic<std::size_t> last_applied_{0};
  // Dumps on_step() has shown, and applied dumps it has acted on.
  std::atomic<std::int64_t> seen_{0};
  std::atomic<std::int64_t> applied_seen_{0};
  // capture_halted(): set by on_step() once a dump it saw halts capture, or
  // by a disk budget.
  std::atomic<bool> full_halted_{false};
  // How many of the manifest's dumps seen() shows: seen_, or all of them
  // after on_close(). A count, not a copy: a step copies no dump.
  std::atomic<std::size_t> visible_{0};
};

}  // namespace tensortap::detail
