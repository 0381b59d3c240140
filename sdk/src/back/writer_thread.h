#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "sdk/src/core/failures.h"
#include "sdk/src/flight/flight.h"
#include "sdk/src/core/staging.h"
#include "sdk/src/core/stats.h"
#include "sdk/src/sinks/store.h"
#include "sdk/src/sinks/tensorboard.h"
#include "writers/src/stats_file.h"

namespace tensortap::detail {

/// The writer thread, the pipeline's back end: takes staging buffers and
/// carries out each record's operation (sdk/src/core/record.h): stores it
/// (Store), hands it to the flight recorder, or appends its statistics row
/// (StatsFile) and lets the rules see it. It never lets an exception
/// escape: a failed record is counted in `Failures` and the thread goes on.
class WriterThread {
 public:
  /// Starts the thread. Every reference must outlive it; `tensorboard` (null:
  /// off) too. `on_wake` (if set) runs on the thread at each wake, at least
  /// every half second, with the batch lock held, so it may write (the
  /// stall watchdog, the control channel); what it throws is counted.
  WriterThread(Staging& staging, Store& store, StatsFile& stats, FlightRecorder& flight, Failures& failures,
               TensorBoard* tensorboard = nullptr, DiskBudget* budget = nullptr,
               std::function<void()> on_wake = {});
  ~WriterThread();
  WriterThread(const WriterThread&) = delete;
  WriterThread& operator=(const WriterThread&) = delete;

  /// Drains what is staged, ends the thread, and finalizes and closes the
  /// run's files.
  void stop();
  /// Makes every record written so far durable and indexed. Call it after
  /// the staging is drained.
  void sync();

  std::int64_t stats_rows() const { return stats_rows_.load(std::memory_order_relaxed); }

 private:
  // A record whose chunks are still arriving: the open record in the
  // format, the statistics so far, or the bytes the flight recorder will
  // hold. `failed`: an earlier chunk failed, the rest are skipped. `lost`:
  // the store failed (counted); the rest feed statistics and TensorBoard.
  struct InFlight {
    std::unique_ptr<RecordSink> sink;
    std::unique_ptr<StatsAccumulator> stats;
    HeldRecord held;
    bool failed = false;
    std::unique_ptr<HistogramAccumulator> histogram;  // TensorBoard's, at its steps
    bool lost = false;
  };

  void run() noexcept;
  // on_wake_, under batch_mu_.
  void wake() noexcept;
  // With nothing to take: makes what was written durable and indexed.
  void publish_idle() noexcept;
  void write_batch(const Staging::Buffer& buffer);
  void write_slot(const Slot& slot, const char* base);
  // The slot's part of its record's operation; throws.
  void apply(const Slot& slot, const char* data, InFlight* open);
  // Whether statistics rows and events of `step` are written (a disk budget).
  bool side_files(std::int64_t step);
  // The slot's part of storing its record; a failure is counted, and the
  // record's statistics and TensorBoard part go on.
  void store(const Slot& slot, const char* data, InFlight* open) noexcept;
  // Writes the statistics table and the TensorBoard events so far; a
  // failure is counted, never thrown.
  void flush_stats(bool durable) noexcept;
  // TensorBoard's part of a record: a failure there is counted, and the
  // record's own operation goes on.
  template <typename F>
  void to_tensorboard(F&& f) noexcept;

  Staging& staging_;
  Store& store_;
  StatsFile& stats_;
  FlightRecorder& flight_;
  // A disk budget (Options::max_bytes), or null.
  DiskBudget* budget_ = nullptr;
  Failures& failures_;
  TensorBoard* const tensorboard_;
  const std::function<void()> on_wake_;
  // Records whose chunks are still arriving, by id.
  std::unordered_map<std::uint64_t, InFlight> in_flight_;
  std::vector<const RecordDesc*> starting_;
  // Held while a batch is written, so sync() from another thread never
  // interleaves with the writer thread.
  std::mutex batch_mu_;
  bool stopped_ = false;
  std::atomic<std::int64_t> stats_rows_{0};
  std::thread thread_;
};

}  // namespace tensortap::detail
