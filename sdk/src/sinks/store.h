#pragma once

#include <atomic>
#include <climits>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "sdk/src/sinks/budget.h"
#include "sdk/src/core/failures.h"
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
  /// Writes a whole record; a failure is the record's, reported. Whether
  /// it was written (not refused by a disk budget, not failed).
  bool write_whole(const RecordDesc& record, const char* data, std::size_t nbytes) noexcept;
  /// Writes the index lines of what is durable; with `force`, makes all of
  /// it durable first (see `Writer::sync`). Reports failures.
  void sync(bool force) noexcept;
  /// Finalizes the writer, indexes what it made durable, and closes both
  /// files: a closed run holds no descriptor.
  void close() noexcept;

  std::int64_t records() const { return records_.load(std::memory_order_relaxed); }
  /// The index lines waiting for their records to be durable (a disk
  /// budget counts them as if written).
  std::uint64_t unwritten_index_bytes() const { return pending_index_.size(); }
  /// The format's writer (a disk budget measures what it holds).
  const Writer& writer() const { return *writer_; }
  /// Full-tensor records pass `budget` first (null: none); must outlive it.
  void set_budget(DiskBudget* budget) { budget_ = budget; }
  /// Budget::KeepLatest of `max_bytes`: the writer remembers each step's
  /// files, and the index goes on in segments (index.<n>.jsonl in `dir`,
  /// which must outlive the store) of about max_bytes/64, so that the lines
  /// of steps given up go with their segment.
  void keep_latest(const Dir& dir, std::uint64_t max_bytes);
  /// Steps a flight-recorder dump writes: a disk budget keeps them within
  /// the dumps' share. Their records begin a file of their own (packed),
  /// which the caller ends with `end_kept()` once they are written.
  void keep_steps(const std::vector<std::int64_t>& steps) {
    if (budget_ == nullptr) return;
    budget_->keep_steps(steps);
    writer_->cut();
  }
  void end_kept() {
    if (budget_ != nullptr) writer_->cut();
  }
  /// KeepLatest: whether `step`'s records are given up (DiskBudget::given_up).
  bool given_up(std::int64_t step) const { return budget_ != nullptr && budget_->given_up(step); }
  /// Whether a record of `step`, one of the last steps written, is written
  /// (a dump's trigger step).
  bool stored(std::int64_t step) const { return recent_steps_.count(step) != 0; }
  /// The newest step a record was written of (-1: none yet).
  std::int64_t newest_written() const { return recent_steps_.empty() ? -1 : *recent_steps_.rbegin(); }
  /// Why a dumped step's records were refused (DiskBudget::dump_refusal).
  std::string dump_refusal() const { return budget_ != nullptr ? budget_->dump_refusal() : std::string(); }
  /// See `Writer::plan_give_up`.
  Writer::GiveUp plan_give_up(std::uint64_t want, std::int64_t from, std::int64_t limit,
                              const std::set<std::int64_t>& kept) const {
    return writer_->plan_give_up(want, from, limit, kept);
  }
  /// Deletes the records of the steps below `below` (`kept` aside) and the
  /// index segments that hold only such records' lines; the bytes freed.
  /// Throws; what went stays gone.
  std::uint64_t give_up(std::int64_t below, const std::set<std::int64_t>& kept);
  /// Before a give-up moves the marker (the budget has already raised it):
  /// every record written so far at a step kept is made durable and its
  /// index line written and synced, so that a crash after the marker moved
  /// still shows the newest steps. Reports failures.
  void make_durable_before_give_up() noexcept;
  std::int64_t bytes() const { return bytes_.load(std::memory_order_relaxed); }

 private:
  // Indexes the first `n` pending records (all: -1).
  void write_index(std::size_t n = static_cast<std::size_t>(-1)) noexcept;
  // After the writer failed: indexes what it still made durable.
  void index_survivors() noexcept;
  // Drops the pending lines of records whose steps are given up: each
  // keeps its place, with no line (see give_up()).
  void drop_given_up_lines();
  // KeepLatest: starts the index's next segment once this one is full;
  // false if it could not (the lines stay in this one).
  bool roll_index() noexcept;

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
    std::int64_t step;
  };
  std::vector<Pending> pending_;
  // Room promised to records begun and not yet written (their lines).
  std::uint64_t promised_ = 0;
  // An index append failed: said once, then retried at each sync.
  bool index_failed_ = false;
  // KeepLatest's index segments: where they go, how large one grows, the
  // one written and those before it that still exist, with their steps.
  const Dir* segments_dir_ = nullptr;
  std::uint64_t segment_bytes_ = 0;
  struct IndexSegment {
    std::uint32_t number = 0;
    std::int64_t min_step = INT64_MAX;
    std::int64_t max_step = INT64_MIN;
  };
  IndexSegment segment_;
  std::vector<IndexSegment> old_segments_;
  // The last steps records were written of (a few: stored()).
  std::set<std::int64_t> recent_steps_;
  std::atomic<std::int64_t> records_{0};
  std::atomic<std::int64_t> bytes_{0};
};

}  // namespace tensortap::detail
