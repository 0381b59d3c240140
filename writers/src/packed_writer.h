#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>

#include <tensortap/format.h>

#include "writers/src/file.h"
#include "writers/src/writer.h"

namespace tensortap::detail {

/// Appends each record, a complete `.npy` image, to a segment file
/// `packed/<8 digits>.npys` at a 64-byte-aligned offset (the gaps are
/// zeros), so `f.seek(offset); np.load(f)` reads it. One segment is open at
/// a time; a new one starts, between records, when the next record would
/// take it past `PackedOptions::segment_bytes`.
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

  /// For PackedSink: writes `n` bytes at `offset` of the open segment, through the buffer.
  void put(std::uint64_t offset, const char* data, std::size_t n);
  /// For PackedSink: its record is finished (`done`) or dropped.
  void release(bool done);
  const std::string& segment_rel() const { return rel_; }
  const std::string& segment_path() const { return file_.path(); }

 private:
  void open_segment();
  void flush();
  void datasync();

  const Dir& dir_;
  PackedOptions options_;
  Dir packed_;
  File file_;
  // The next segment's number and the open one's path relative to the run.
  std::uint32_t next_segment_ = 0;
  std::string rel_;
  // Where the next record may begin (before alignment): past every byte reserved.
  std::uint64_t end_ = 0;
  // Bytes not yet written, for the segment's offsets [buf_start_, buf_start_ + buf_.size()).
  std::string buf_;
  std::uint64_t buf_start_ = 0;
  // The record's .npy header, built here (its memory kept from record to record).
  std::string header_;
  // Records begun and not yet finished or dropped: the segment cannot roll under them.
  int live_ = 0;
  // Whether a finished record's bytes may not be durable yet.
  bool undurable_ = false;
  // Whether the directory entry of the open segment has not been synced yet.
  bool new_segment_ = false;
  std::chrono::steady_clock::time_point last_sync_;
};

}  // namespace tensortap::detail
