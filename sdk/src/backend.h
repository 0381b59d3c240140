#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <unordered_set>

#include "sdk/src/staging.h"
#include "writers/src/run_files.h"
#include "writers/src/writer.h"

namespace tensortap::detail {

/// The writer thread: drains staging buffers into the run's Writer and
/// appends index lines. It never lets an exception escape: a failed record
/// is counted, the first failure is printed once on stderr and kept for
/// `flush()` and `close()` to rethrow, and the thread goes on.
class Backend {
 public:
  Backend(Staging& staging, std::unique_ptr<Writer> writer, std::unique_ptr<IndexFile> index);
  ~Backend();
  Backend(const Backend&) = delete;
  Backend& operator=(const Backend&) = delete;

  /// Drains what is staged, finalizes the writer and ends the thread.
  void stop();
  /// Makes every record written so far durable and indexed. Call it after
  /// the staging is drained.
  void sync();

  std::int64_t records() const { return records_.load(std::memory_order_relaxed); }
  std::int64_t bytes() const { return bytes_.load(std::memory_order_relaxed); }
  std::int64_t errors() const { return errors_.load(std::memory_order_relaxed); }
  /// The first failure's message, or "" if none.
  std::string first_error() const;
  /// Counts a failure that happened elsewhere (in a hook) like one of the
  /// writer's own: reported once on stderr, rethrown by flush() and close().
  void report(const std::string& what) noexcept { fail(nullptr, what); }

 private:
  void run() noexcept;
  void write_slot(const Slot& slot, const char* base);
  void write_index() noexcept;
  void fail(const RecordMeta* meta, const std::string& what) noexcept;

  Staging& staging_;
  std::unique_ptr<Writer> writer_;
  std::unique_ptr<IndexFile> index_;
  // Records whose chunks are still arriving, and records that failed part
  // way (their later chunks are skipped).
  std::unordered_map<std::uint64_t, std::unique_ptr<RecordSink>> open_;
  std::unordered_set<std::uint64_t> failed_;
  // Index lines of records not yet durable (see Writer::sync()).
  std::string pending_index_;
  // Held while a batch is written, so sync() from another thread never
  // interleaves with the writer thread.
  std::mutex batch_mu_;
  bool stopped_ = false;
  std::atomic<std::int64_t> records_{0};
  std::atomic<std::int64_t> bytes_{0};
  std::atomic<std::int64_t> errors_{0};
  mutable std::mutex error_mu_;
  std::string first_error_;
  std::thread thread_;
};

}  // namespace tensortap::detail
