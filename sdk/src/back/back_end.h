#pragma once

#include <cstdint>
#include <functional>
#include <memory>

#include <tensortap/counters.h>
#include <tensortap/options.h>

#include "sdk/src/core/failures.h"
#include "sdk/src/flight/flight.h"
#include "sdk/src/sinks/run_json.h"
#include "sdk/src/run/settings.h"
#include "sdk/src/core/staging.h"
#include "sdk/src/sinks/store.h"
#include "sdk/src/sinks/tensorboard.h"
#include "sdk/src/back/control.h"
#include "sdk/src/back/step_clock.h"
#include "sdk/src/back/watchdog.h"
#include "sdk/src/back/writer_thread.h"
#include "writers/src/run_dir.h"
#include "writers/src/stats_file.h"

namespace tensortap::detail {

class CudaEngine;

/// The back side of one run: its directory (open and locked from
/// construction to close), run.json, the records' files, the statistics
/// table, the flight recorder, the writer thread and, with CUDA, the
/// copier. The front end owns one on every rank that captures.
class BackEnd {
 public:
  /// What the back end asks of the training thread's half, from the
  /// writer thread: the step in progress (-1 before the first), for the
  /// watchdog and ctl; the records the snapshotter dropped, for ctl status.
  struct FrontSide {
    std::function<std::int64_t()> step;
    std::function<std::int64_t()> dropped;
  };

  /// Opens the directory, writes run.json and starts the writer thread.
  /// Throws `Error` naming the path. `options`, `staging` and `failures`
  /// must outlive it, and what `front` reads.
  BackEnd(const Options& options, const Placement& placement, Staging& staging, Failures& failures,
          FrontSide front);
  /// Stops (see `stop()`).
  ~BackEnd();
  BackEnd(const BackEnd&) = delete;
  BackEnd& operator=(const BackEnd&) = delete;

  /// See RunManifest::add_aliases.
  void add_aliases(const std::string& name, const std::vector<std::string>& others) {
    manifest_.add_aliases(name, others);
  }
  /// The taps' declared nonlinearities: run.json's "taps" (rewritten by
  /// the writer thread at its next wake) and the live health rules.
  void add_taps(const std::vector<std::pair<std::string, std::string>>& taps) {
    manifest_.add_taps(taps);
    flight_->declare_taps(taps);
  }
  FlightRecorder& flight() { return *flight_; }
  const FlightRecorder& flight() const { return *flight_; }
  /// The copier, or null without CUDA (build or device).
  CudaEngine* engine() const { return cuda_.get(); }

  /// Returns when everything queued so far is through the writer thread;
  /// with `index`, also durable and indexed.
  void flush(bool index);
  /// Moves what the copier holds to staging, drains it, ends both threads
  /// and closes the files.
  void stop();
  /// After `stop()`: rewrites run.json as closed with `counters`, and lets go
  /// of the directory and its lock. Throws `Error`.
  void close(const Counters& counters, const std::string& first_error);

  /// The run directory's descriptor, to ask its file system for room
  /// (fstatvfs); valid until `close()`.
  int space_fd() const { return run_dir_->dir().fd(); }
  std::int64_t records() const { return store_->records(); }
  std::int64_t bytes() const { return store_->bytes(); }
  std::int64_t stats_rows() const { return thread_->stats_rows(); }
  /// Full-tensor records a disk budget refused.
  std::int64_t budget_refused() const { return budget_->refused(); }
  bool budget_reached() const { return budget_->reached(); }
  /// Empty while statistics and TensorBoard's events go on; else
  /// "statistics stopped at step K (<reason>)" (any thread: ctl's answers).
  std::string monitoring_stopped() const;
  /// tensortap ctl's channel (its `on()` says whether it takes requests).
  ControlChannel& control() const { return *control_; }

 private:
  // The writer thread's wake: the watchdog's check, the control channel.
  void on_wake();
  // ctl's dump and status, on the writer thread.
  std::string request_dump(std::int64_t step);
  std::string status() const;
  // KeepLatest: what giving up the steps below a step frees, every output
  // counted (records, statistics segments, event files; Writer::plan_give_up),
  // and the budget's state with what they gave up.
  Writer::GiveUp plan_give_up(std::uint64_t want, std::int64_t from, std::int64_t limit,
                              const std::set<std::int64_t>& kept) const;
  BudgetState budget_state() const;
  // KeepLatest: how the disk budget gives up steps here (plan, apply, and
  // the statistics and event files apart); failures to delete are counted
  // in `failures`, which outlives the back end.
  DiskBudget::GiveUpHooks give_up_hooks(Failures& failures);

  Staging& staging_;
  std::unique_ptr<RunDir> run_dir_;
  RunManifest manifest_;
  std::unique_ptr<Store> store_;
  std::unique_ptr<DiskBudget> budget_;
  std::unique_ptr<StatsFile> stats_;
  std::unique_ptr<TensorBoard> tensorboard_;  // null unless Options::tensorboard
  std::unique_ptr<FlightRecorder> flight_;
  FrontSide front_;
  StepClock clock_;
  std::unique_ptr<Watchdog> watchdog_;  // null unless Options::stall_after
  std::unique_ptr<ControlChannel> control_;
  std::unique_ptr<WriterThread> thread_;
  // Last, so stopped first: its copier thread feeds staging and reports to
  // the failures. Null without CUDA (build or device).
  std::shared_ptr<CudaEngine> cuda_;
};

}  // namespace tensortap::detail
