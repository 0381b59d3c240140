#pragma once

#include <atomic>
#include <cstdint>
#include <mutex>
#include <string>

#include "writers/src/writer.h"

namespace tensortap::detail {

/// The run's failures, from any thread: the writer thread, the copier and
/// hooks. Nothing here throws. A failure is counted, the first one is
/// printed once on stderr and kept for `flush()` and `close()` to rethrow
/// (the background threads' errors never cross threads as exceptions).
class Failures {
 public:
  /// A failure that loses `lost` records: 1 for a record's own failure, 0
  /// for a file-level one whose records are counted when their fate is
  /// known. `record` (may be null) is named in the message.
  void add(const RecordDesc* record, const std::string& what, std::int64_t lost) noexcept;
  /// A record's own failure.
  void add(const RecordDesc& record, const std::string& what) noexcept { add(&record, what, 1); }

  /// Records captured that will never be readable.
  std::int64_t lost() const { return lost_.load(std::memory_order_relaxed); }
  /// Whether anything failed: a record, or a write of the run's files.
  bool any() const { return any_.load(std::memory_order_acquire); }
  /// The first failure's message, or "" if none.
  std::string first() const;

  /// The message of the exception being handled, whatever its type.
  static std::string current();

 private:
  std::atomic<std::int64_t> lost_{0};
  std::atomic<bool> any_{false};
  mutable std::mutex mu_;
  std::string first_;
};

}  // namespace tensortap::detail
