#pragma once

// What run.json says: the recorder's options, its place in the world, its
// counts and dumps; and a dump's line of dumps.jsonl. The sdk renders them
// because it knows Options, Stats and DumpRecord; writers/ writes them
// (write_run_json() and LinesFile in run_files.h).

#include <cstdint>
#include <string>
#include <vector>

#include <tensortap/options.h>
#include <tensortap/recorder.h>

namespace tensortap::detail {

/// What run.json says besides the options.
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
  /// The flight recorder's dumps and the triggers' marks.
  std::vector<DumpRecord> dumps;
};

/// The whole text of run.json for a run with `options` (DESIGN section 3).
std::string run_json(const Options& options, const RunInfo& info);

/// Appends `dump` as one JSON object, without a newline: an entry of
/// run.json's "dumps" and a line of dumps.jsonl, in the same form.
void append_dump_json(std::string& out, const DumpRecord& dump);

}  // namespace tensortap::detail
