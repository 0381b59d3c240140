#pragma once

#include <cstdint>
#include <string>

#include "writers/src/file.h"

namespace tensortap::detail {

/// The name of an event file (EVENTS.md):
/// `events.out.tfevents.<seconds>.<host>.<pid>.tensortap`, the host name's
/// characters outside [A-Za-z0-9_-] replaced by '_'.
std::string event_file_name(std::int64_t unix_seconds, const std::string& host, std::int64_t pid);

/// One TensorBoard event file in a run directory, appended to by the writer
/// thread. Events are buffered and written by `flush()`; a write that fails
/// (a full disk) is cut back to the last whole event, so the file always
/// holds whole events, and the failed ones are dropped: the error is thrown
/// once, and later events still go in.
class EventFile {
 public:
  /// Creates the file (exclusively, never through a link) and writes its
  /// first event. Throws `Error` naming the path. A file that follows
  /// another (a roll) names a second after `after_seconds` at least, so
  /// that the names sort in the order written, as TensorBoard reads them.
  explicit EventFile(const Dir& dir, std::int64_t after_seconds = -1);
  EventFile(const EventFile&) = delete;
  EventFile& operator=(const EventFile&) = delete;

  /// Buffers a serialized `Event` (tb::file_version_event and the others).
  void append(const std::string& event);
  /// Writes what is buffered, so TensorBoard sees it; with `durable`, also
  /// fdatasyncs. Throws `Error` with the path and errno.
  void flush(bool durable);
  /// Closes the file, reporting what close() says. Throws `Error`.
  void close();
  std::string path() const { return file_.path(); }
  /// Its name in the run directory, and the seconds the name holds.
  const std::string& name() const { return name_; }
  std::int64_t seconds() const { return seconds_; }
  /// Bytes on disk, and buffered.
  std::uint64_t size() const { return size_; }
  std::uint64_t buffered() const { return pending_.size(); }

 private:
  File file_;
  std::string name_;
  std::int64_t seconds_ = 0;
  std::string pending_;
  std::uint64_t size_ = 0;
};

}  // namespace tensortap::detail
