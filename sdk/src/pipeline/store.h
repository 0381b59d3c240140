#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "sdk/src/pipeline/budget.h"
#include "sdk/src/pipeline/failures.h"
#include "writers/src/lines_file.h"
#include "writers/src/writer.h"

namespace tensortap::detail {

/// The run's records on disk: the format's Writer and index.jsonl. A record
/// counts as written only once its index line is written, and its line
/// only once the Writer says the record is durable, so a reader that
/// follows the index always finds complete data and run.json's counts are
/// what a reader can reach. Used under the writer thread's lock.
class Store {
 public:
  Store(std::unique_ptr<Writer> writer, std::unique_ptr<LinesFile> index, Failures& failures);

  /// See `Writer::prepare`; a failure is reported, not thrown.
  void prepare(const std::vector<const RecordDesc*>& records) noexcept;
  /// Starts a record (see `Writer::begin`); throws. The index keeps room
  /// for the record's line first, so a record whose bytes reach the disk is
  /// always indexed: on a full disk it is refused before any byte is written.
  std::unique_ptr<RecordSink> begin(const RecordDesc& record);
  /// A record is complete at `location`: its index line waits for `sync()`.
  void written(const RecordDesc& record, const std::string& location);
  /// Writes a whole record; a failure is the record's, reported.
  void write_whole(const RecordDesc& record, const char* data, std::size_t nbytes) noexcept;
  /// Writes the index lines of what is durable; with `force`, makes all of
  /// it durable first (see `Writer::sync`). Reports failures.
  void sync(bool force) noexcept;
  /// Finalizes the writer, indexes what it made durable, and closes both
  /// files: a closed run holds no descriptor.
  void close() noexcept;

  std::int64_t records() const { return records_.load(std::memory_order_relaxed); }
  /// The format's writer (a disk budget measures what it holds).
  const Writer& writer() const { return *writer_; }
  /// Full-tensor records pass `budget` first (null: none); must outlive it.
  void set_budget(DiskBudget* budget) { budget_ = budget; }
  std::int64_t bytes() const { return bytes_.load(std::memory_order_relaxed); }

 private:
  // Indexes the first `n` pending records (all: -1).
  void write_index(std::size_t n = static_cast<std::size_t>(-1)) noexcept;
  // After the writer failed: indexes what it still made durable.
  void index_survivors() noexcept;

  std::unique_ptr<Writer> writer_;
  DiskBudget* budget_ = nullptr;
  std::unique_ptr<LinesFile> index_;
  Failures& failures_;
  // Index lines of records not yet durable, oldest first, and where each
  // line ends and what its record counts.
  std::string pending_index_;
  struct Pending {
    std::size_t line_end;
    std::int64_t bytes;
  };
  std::vector<Pending> pending_;
  // Room promised to records begun and not yet written (their lines).
  std::uint64_t promised_ = 0;
  // An index append failed: said once, then retried at each sync.
  bool index_failed_ = false;
  std::atomic<std::int64_t> records_{0};
  std::atomic<std::int64_t> bytes_{0};
};

}  // namespace tensortap::detail
