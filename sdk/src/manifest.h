#pragma once

#include <mutex>
#include <string>
#include <vector>

#include <tensortap/options.h>
#include <tensortap/recorder.h>

#include "sdk/src/run_json.h"
#include "writers/src/file.h"

namespace tensortap::detail {

/// The run's `run.json`: what it says (RunInfo) and its rewrites. Written
/// when the run opens, after each flight-recorder dump (from the writer
/// thread) and at close (from the closing thread).
class RunManifest {
 public:
  /// `options` and `dir` must outlive it.
  RunManifest(const Options& options, RunInfo info) : options_(options), info_(std::move(info)) {}

  /// Writes the first run.json into `dir`, which every later rewrite uses.
  void open(const Dir& dir);
  /// Adds a dump and rewrites run.json. Throws `Error`.
  void add_dump(const DumpRecord& dump);
  /// The dumps so far.
  std::vector<DumpRecord> dumps() const;
  /// Marks the run closed with its counters and first error, and rewrites
  /// run.json one last time. Throws `Error`.
  void close(const Stats& stats, const std::string& first_error);

  /// Where and as which rank this process writes; fixed once placed.
  const std::string& run_dir() const { return info_.run_dir; }
  std::int64_t rank() const { return info_.rank; }
  std::int64_t world_size() const { return info_.world_size; }

 private:
  const Options& options_;
  const Dir* dir_ = nullptr;
  mutable std::mutex mu_;
  RunInfo info_;
};

}  // namespace tensortap::detail
