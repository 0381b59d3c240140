#pragma once

#include <chrono>
#include <climits>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <tensortap/format.h>

#include "writers/src/file.h"
#include "writers/src/writer.h"

namespace tensortap::detail {

/// Appends each record, a complete `.npy` image, to a segment file
/// `packed/<8 digits>.npys` at a 64-byte-aligned offset (the gaps are
/// zeros), so `f.seek(offset); np.load(f)` reads it. New records go to one
/// open segment; a new one starts when the next record would take it past
/// `PackedOptions::segment_bytes`. A record still arriving in chunks then
/// finishes in the segment it began in, which stays open (retiring) until it
/// does: with several capturing threads some record is nearly always in
/// flight, and waiting for none would let a segment grow without bound.
///
/// Every record's place is reserved when it begins, and its bytes are written
/// at their own offsets (pwrite): a failed write leaves nothing to undo, and
/// a record discarded part way leaves an unindexed stretch the next record
/// skips. Small records gather in a buffer and go out together.
class PackedWriter final : public Writer {
 public:
  PackedWriter(const Dir& dir, const PackedOptions& options);
  ~PackedWriter() override;
  std::unique_ptr<RecordSink> begin(const RecordDesc& meta) override;
  bool sync(bool force) override;
  void close() override;
  std::size_t durable_after_failure() noexcept override;
  /// Every segment's reserved bytes (what its file grows to).
  std::uint64_t disk_bytes() const override { return rolled_bytes_ + end_; }
  std::uint64_t bytes_held_by(std::int64_t step) const override;
  /// Under KeepLatest a segment holds at most max_bytes/8 and ends at a
  /// step boundary once past half of that, so that giving steps up frees
  /// whole segments, soon after their last step goes.
  void keep_latest(std::uint64_t max_bytes) override;
  void cut() override { cut_ = keep_latest_; }
  GiveUp plan_give_up(std::uint64_t want, std::int64_t from, std::int64_t limit,
                      const std::set<std::int64_t>& kept) const override;
  std::uint64_t give_up(std::int64_t below, const std::set<std::int64_t>& kept) override;

  /// A record finished since the last sync that made all durable: the
  /// segment it is in, by number, and where its bytes end.
  struct Finished {
    std::uint32_t segment;
    std::uint64_t end;
  };

  /// One segment file and the bytes gathered for it.
  struct Segment {
    File file;
    // Its number, as its name has it.
    std::uint32_t number = 0;
    // Its path relative to the run, as index lines name it.
    std::string rel;
    // Bytes not yet written, for the offsets [buf_start, buf_start + buf.size()).
    std::string buf;
    std::uint64_t buf_start = 0;
    // Records begun in it and not yet finished or dropped.
    int live = 0;
    // Whether a finished record's bytes may not be durable yet.
    bool undurable = false;
    // Whether its directory entry has not been synced yet.
    bool new_entry = true;
    // A flush failed (a full disk) and the buffer still holds what it could
    // not write: new records wait until it goes out.
    bool stalled = false;
    // The steps of its records, and its size once rolled past (KeepLatest).
    std::int64_t min_step = INT64_MAX;
    std::int64_t max_step = INT64_MIN;
    std::uint64_t size = 0;

    /// Writes `n` bytes at `offset`, through the buffer.
    void put(std::uint64_t offset, const char* data, std::size_t n);
    /// Writes what the buffer holds. On failure (a full disk) what went out
    /// leaves the buffer, and the rest stays for a later flush.
    void flush();
    /// Makes what was written durable, its name included.
    void datasync(const Dir& packed);
  };

 private:
  std::unique_ptr<Segment> open_segment();
  // Lets go of `s`, whose records are all finished or dropped: durable, closed.
  void close_segment(Segment& s);
  // Closes the retiring segments whose last record has ended.
  void close_retired();
  // Calls `f` on every segment still held: the retiring ones, then the open one.
  template <typename F>
  void each_segment(F&& f) {
    for (const auto& s : retiring_) f(*s);
    if (open_) f(*open_);
  }

  const Dir& dir_;
  PackedOptions options_;
  Dir packed_;
  // The next segment's number.
  std::uint32_t next_segment_ = 0;
  // Where new records go.
  std::unique_ptr<Segment> open_;
  // Where the next record may begin in open_ (before alignment): past every byte reserved.
  std::uint64_t end_ = 0;
  // The bytes of the segments rolled past (each's end when it was).
  std::uint64_t rolled_bytes_ = 0;
  // Segments rolled past with records still arriving in chunks.
  std::vector<std::unique_ptr<Segment>> retiring_;
  // Records finished and not yet known durable, oldest first: after a
  // failed flush, those wholly behind their segment's buffer are indexed
  // (durable_after_failure).
  std::vector<Finished> finished_;
  // The record's .npy header, built here (its memory kept from record to record).
  std::string header_;
  std::chrono::steady_clock::time_point last_sync_;
  // Budget::KeepLatest: the most a segment holds, and the segments closed
  // (what giving up steps may delete), oldest first.
  bool keep_latest_ = false;
  bool cut_ = false;  // the next record begins a segment (cut())
  std::uint64_t cap_ = 0;
  struct Closed {
    std::string rel;
    std::uint64_t size;
    std::int64_t min_step, max_step;
  };
  std::vector<Closed> closed_;
  // Whether a kept step lies in a closed segment's span (it is not deleted).
  static bool holds_kept(const Closed& c, const std::set<std::int64_t>& kept);
};

}  // namespace tensortap::detail
