#pragma once

#include <string>
#include <vector>

#include <tensortap/options.h>
#include <tensortap/recorder.h>

#include "writers/src/writer.h"

namespace tensortap::detail {

/// One dump of the flight recorder, as run.json lists it under "dumps".
struct DumpInfo {
  /// The step of the trigger.
  std::int64_t step = 0;
  /// "nan", "inf" or "user".
  std::string reason;
  /// The steps written, ascending: the held ones and `step`.
  std::vector<std::int64_t> steps;
  /// The record whose statistics tripped it (not for "user").
  std::string kind, name;
};

/// What run.json says.
struct RunInfo {
  /// Where this rank writes (the options' dir, or its rank<r>/ below it).
  std::string run_dir;
  std::int64_t rank = 0;
  std::int64_t world_size = 1;
  std::string start_time;
  std::string end_time;
  bool closed = false;
  Stats stats;
  std::string first_error;
  std::vector<DumpInfo> dumps;
};

/// Makes `dir` ready for a new run: creates it, refuses one that already
/// holds a run (a run.json) unless `options.overwrite()` is set, in which
/// case it removes only what tensortap writes. Throws `Error` with the path
/// and the OS error.
void prepare_run_dir(const std::string& dir, const Options& options);

/// Rewrites `<info.run_dir>/run.json` atomically.
void write_run_json(const Options& options, const RunInfo& info);

/// The current UTC time as ISO 8601 ("2026-11-21T05:45:00.123Z").
std::string utc_now();

/// The line index.jsonl gets for a record written at `location`.
void append_index_line(std::string& out, const RecordMeta& meta, const std::string& location);

/// `<dir>/index.jsonl`, opened for appending. Lines are written with one
/// write() per batch, after the files they name are in place.
class IndexFile {
 public:
  explicit IndexFile(const std::string& dir);
  ~IndexFile();
  IndexFile(const IndexFile&) = delete;
  IndexFile& operator=(const IndexFile&) = delete;
  void append(const std::string& lines);

 private:
  std::string path_;
  int fd_ = -1;
};

}  // namespace tensortap::detail
