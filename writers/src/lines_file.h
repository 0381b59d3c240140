#pragma once

// The JSON-lines files of a run (index.jsonl, stats_series.jsonl,
// dumps.jsonl): appending whole lines, and the index line of a record.

#include <cstdint>
#include <string>

#include "writers/src/file.h"
#include "writers/src/writer.h"

namespace tensortap::detail {

/// The line index.jsonl gets for a record written at `location`.
void append_index_line(std::string& out, const RecordDesc& meta, const std::string& location);

/// A file of JSON lines (`index.jsonl`, `stats_series.jsonl`, `dumps.jsonl`)
/// opened for appending. Lines are written with one write() per batch; a
/// batch that fails part way (a full disk) is cut off again, so the file only
/// ever holds whole lines and a later append never glues onto a torn one.
class LinesFile {
 public:
  /// Creates `name` in `dir`; it must not exist yet.
  LinesFile(const Dir& dir, const std::string& name);
  ~LinesFile();
  LinesFile(const LinesFile&) = delete;
  LinesFile& operator=(const LinesFile&) = delete;
  void append(const std::string& lines);
  void datasync() { file_.datasync(); }

 private:
  // Keeps room allocated past the end for the next lines (see lines_file.cpp).
  void reserve() noexcept;

  File file_;
  std::uint64_t size_ = 0;
  // The file's blocks end here (fallocate KEEP_SIZE): appends up to it need
  // no new block, so they succeed on a full disk.
  std::uint64_t reserved_ = 0;
  // A failed append could not be cut off: the next starts a new line.
  bool torn_ = false;
};

}  // namespace tensortap::detail
