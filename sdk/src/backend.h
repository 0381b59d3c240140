#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <unordered_set>

#include "sdk/src/flight.h"
#include "sdk/src/staging.h"
#include "sdk/src/stats.h"
#include "sdk/src/triggers.h"
#include "writers/src/run_files.h"
#include "writers/src/stats_file.h"
#include "writers/src/writer.h"

namespace tensortap::detail {

/// The writer thread: drains staging buffers into the run's Writer and
/// appends index lines; computes statistics into the run's table; runs the
/// flight recorder (holds full records instead of writing them, and dumps
/// them when a tensor holds NaN or Inf or the user asks). It never lets an
/// exception escape: a failed record is counted, the first failure is
/// printed once on stderr and kept for `flush()` and `close()` to rethrow,
/// and the thread goes on.
class Backend {
 public:
  /// `on_dump` is called on the writer thread after each flight-recorder
  /// dump is on disk; it must not throw.
  Backend(Staging& staging, std::unique_ptr<Writer> writer, std::unique_ptr<LinesFile> index,
          const Options& options, const Dir& dir, std::function<void(const DumpRecord&)> on_dump);
  ~Backend();
  Backend(const Backend&) = delete;
  Backend& operator=(const Backend&) = delete;

  /// Drains what is staged, finalizes the writer, ends the thread and
  /// closes every file: a closed run holds no descriptor.
  void stop();
  /// Makes every record written so far durable and indexed. Call it after
  /// the staging is drained.
  void sync();

  std::int64_t records() const { return records_.load(std::memory_order_relaxed); }
  std::int64_t bytes() const { return bytes_.load(std::memory_order_relaxed); }
  /// Records captured that will never be readable: written + errors is
  /// every record captured, once the writer has stopped.
  std::int64_t errors() const { return errors_.load(std::memory_order_relaxed); }
  std::int64_t stats_rows() const { return stats_rows_.load(std::memory_order_relaxed); }
  std::int64_t dumps() const { return dumps_.load(std::memory_order_acquire); }
  /// Records the flight recorder could not hold within its byte budget.
  std::int64_t flight_dropped() const { return flight_dropped_.load(std::memory_order_relaxed); }
  /// The first failure's message, or "" if none.
  std::string first_error() const;
  /// Whether anything failed: a record, or a write of the run's files.
  bool failed() const { return any_failure_.load(std::memory_order_acquire); }
  /// Reports a failure that happened elsewhere (in a hook) like one of the
  /// writer's own: printed once on stderr, rethrown by flush() and close(),
  /// and counted as `lost` records that failed.
  void report(const std::string& what, std::int64_t lost = 1) noexcept { fail(nullptr, what, lost); }

 private:
  void run() noexcept;
  void write_batch(const Staging::Buffer& buffer, std::vector<const RecordMeta*>& starting);
  void write_slot(const Slot& slot, const char* base);
  // The record's statistics are complete: a row, and maybe a trigger.
  void finish_stats(const RecordMeta& meta, const TensorStats& stats);
  // A whole record the flight recorder got: written (inside a dump's
  // window), held, or let go (capture stopped after a dump).
  void keep(HeldRecord record);
  // A rule fired (or dump() was called): writes the held steps and opens a
  // window for what is still to come of the trigger's step; without a
  // flight recorder, only marks the run.
  void trigger(DumpRecord dump);
  void write_whole(const RecordMeta& meta, const char* data, std::size_t nbytes);
  void flush_stats(bool durable) noexcept;
  void write_index() noexcept;
  // A record is complete at `location`: its index line waits for write_index().
  void written(const RecordMeta& meta, const std::string& location);
  // A failure: `lost` records are lost by it (those counted in errors()),
  // 1 for a record's own failure, 0 for a file-level one whose records are
  // counted when their fate is known.
  void fail(const RecordMeta* meta, const std::string& what, std::int64_t lost) noexcept;
  void fail(const RecordMeta* meta, const std::string& what) noexcept { fail(meta, what, meta != nullptr ? 1 : 0); }
  // The message of the exception being handled, whatever its type.
  static std::string current_error();

  Staging& staging_;
  std::unique_ptr<Writer> writer_;
  std::unique_ptr<LinesFile> index_;
  // Records whose chunks are still arriving, and records that failed part
  // way (their later chunks are skipped).
  std::unordered_map<std::uint64_t, std::unique_ptr<RecordSink>> open_;
  std::unordered_set<std::uint64_t> failed_;
  // Statistics of records whose chunks are still arriving.
  std::unordered_map<std::uint64_t, StatsAccumulator> accumulating_;
  StatsFile stats_;
  Triggers triggers_;
  // The flight recorder (null when off), the records it is assembling from
  // chunks, and the window [lo, hi] of steps the last dump covers: their
  // records still to come are written, not held.
  std::unique_ptr<FlightRing> ring_;
  std::unordered_map<std::uint64_t, HeldRecord> holding_;
  std::int64_t window_lo_ = -1, window_hi_ = -1;
  AfterDump after_dump_;
  // After a dump that stops capture: later records are let go.
  bool halted_ = false;
  std::function<void(const DumpRecord&)> on_dump_;
  // Index lines of records not yet durable (see Writer::sync()), and what
  // they count: a record counts as written once its line is in the index,
  // so run.json's counts are what a reader can reach.
  std::string pending_index_;
  std::int64_t pending_records_ = 0;
  std::int64_t pending_bytes_ = 0;
  // Held while a batch is written, so sync() from another thread never
  // interleaves with the writer thread.
  std::mutex batch_mu_;
  bool stopped_ = false;
  std::atomic<std::int64_t> records_{0};
  std::atomic<std::int64_t> bytes_{0};
  std::atomic<std::int64_t> errors_{0};
  std::atomic<bool> any_failure_{false};
  std::atomic<std::int64_t> stats_rows_{0};
  std::atomic<std::int64_t> dumps_{0};
  std::atomic<std::int64_t> flight_dropped_{0};
  mutable std::mutex error_mu_;
  std::string first_error_;
  std::thread thread_;
};

}  // namespace tensortap::detail
