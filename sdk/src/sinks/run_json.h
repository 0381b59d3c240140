#pragma once

// run.json and dumps.jsonl, the sdk's side of them: what run.json says (the
// recorder's options, its place in the world, its counters and dumps), a
// dump's line of dumps.jsonl, and RunManifest, which keeps both on disk. The
// sdk renders them because it knows Options, Counters and Dump; writers/
// writes the bytes (write_run_json() and LinesFile).

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <limits>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include <tensortap/counters.h>
#include <tensortap/options.h>

#include "sdk/src/sinks/budget.h"
#include "writers/src/file.h"
#include "writers/src/lines_file.h"
#include "writers/src/run_dir.h"

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
  Counters counters;
  std::string first_error;
  /// The flight recorder's dumps and the triggers' marks.
  std::vector<Dump> dumps;
  /// A disk budget's state, at close ("budget"; unset: no budget).
  std::optional<BudgetState> budget;
  /// A nonce made when the run starts ("run_id"): a `tensortap ctl`
  /// request must carry it, so a request meant for an earlier run in this
  /// directory is refused.
  std::string run_id;
  /// TENSORTAP_OPTIONS as given, if set ("options_from_env").
  std::optional<std::string> options_from_env;
  /// Tensors watched under several names (tied weights): the name its
  /// records are written under, and its other names.
  std::vector<std::pair<std::string, std::vector<std::string>>> aliases;
  /// The taps that declare a nonlinearity: name, word ("taps").
  std::vector<std::pair<std::string, std::string>> taps;
};

/// The whole text of run.json for a run with `options` (docs/design.md#runjson).
std::string run_json(const Options& options, const RunInfo& info);

/// Appends `dump` as one JSON object, without a newline: an entry of
/// run.json's "dumps" and a line of dumps.jsonl, in the same form.
void append_dump_json(std::string& out, const Dump& dump);


/// The run's `run.json` (what it says: RunInfo) and `dumps.jsonl`. run.json
/// is written twice: when the run opens and at close, which lists every
/// dump. In between each flight-recorder dump (from the writer thread) is
/// appended to dumps.jsonl, one line, made when the first dump is: a dump
/// costs the same at the thousandth as at the first, where rewriting
/// run.json with every dump so far grew with the run. run.json's reserved
/// blocks grow with the dumps, so that close() still fits on a full disk.
/// How many dumps run.json lists (the last ones; "dumps_omitted" counts the rest).
constexpr std::size_t kListedDumps = 1000;

class RunManifest {
 public:
  /// `options` and `dir` must outlive it.
  RunManifest(const Options& options, RunInfo info) : options_(options), info_(std::move(info)) {}

  /// Writes the first run.json into `dir`, where dumps.jsonl goes too.
  void open(const Dir& dir);
  /// Adds a dump and appends its line to dumps.jsonl, on disk (fdatasync)
  /// when it returns. Throws `Error`; the dump is kept all the same, and
  /// the next dump's append writes the lines a failed one left out. From
  /// one thread (the writer thread), before close().
  void add_dump(const Dump& dump);
  /// One tensor watched under several names: written under `name`, also
  /// known as `others` (run.json's "aliases", at close).
  void add_aliases(const std::string& name, const std::vector<std::string>& others);
  /// Taps that declare a nonlinearity (run.json's "taps"): kept, and said
  /// at the writer thread's next `rewrite()` (any thread).
  void add_taps(const std::vector<std::pair<std::string, std::string>>& taps);
  /// Whether taps were added since the last call (writer thread).
  bool take_taps_change() { return taps_changed_.exchange(false); }
  /// run.json rewritten now with what it knows, on disk. Throws `Error`.
  /// Writer thread.
  void rewrite();
  /// The disk budget's state, for run.json's "budget" at close.
  void set_budget(const BudgetState& state) {
    std::lock_guard<std::mutex> lock(mu_);
    info_.budget = state;
  }
  /// run.json rewritten now with the budget's `state`, on disk (file and
  /// entry synced): before KeepLatest gives up the steps below
  /// `state.given_up_below` (then nothing may be deleted if it throws), and
  /// when monitoring stops or resumes ("monitoring"). Throws `Error`.
  /// Writer thread.
  void write_budget(const BudgetState& state);
  /// With a disk budget: dumps.jsonl rolls to dumps.1.jsonl past `bytes`.
  void roll_dumps_at(std::uint64_t bytes) { roll_bytes_ = bytes; }
  /// A copy of the first `limit` dumps (all of them by default).
  std::vector<Dump> dumps(std::size_t limit = std::numeric_limits<std::size_t>::max()) const;
  /// The last of the first `limit` dumps; a default Dump if none.
  Dump last_dump(std::size_t limit) const;
  /// Closes dumps.jsonl, marks the run closed with its counters and first
  /// error, and rewrites run.json one last time, every dump listed. Throws
  /// `Error`.
  void close(const Counters& counters, const std::string& first_error);

  /// Where and as which rank this process writes; fixed once placed.
  const std::string& run_dir() const { return info_.run_dir; }
  const std::string& run_id() const { return info_.run_id; }
  std::int64_t rank() const { return info_.rank; }
  std::int64_t world_size() const { return info_.world_size; }

 private:
  const Options& options_;
  const Dir* dir_ = nullptr;
  mutable std::mutex mu_;
  RunInfo info_;
  std::atomic<bool> taps_changed_{false};
  // dumps.jsonl, from the first dump on, and how many of info_.dumps it
  // has. Not under mu_: only add_dump() (one thread) and then close() use
  // them.
  std::unique_ptr<LinesFile> dumps_file_;
  std::size_t appended_ = 0;
  // The bytes reserved for run.json, and what close() will write there at
  // most. Set by open(), then the writer thread's like the file.
  std::uint64_t run_json_room_ = 0;
  std::uint64_t run_json_need_ = 0;
  // The sizes of the dumps run.json lists (the last kListedDumps), and
  // where dumps.jsonl rolls (0: never).
  std::deque<std::size_t> listed_bytes_;
  std::uint64_t roll_bytes_ = 0;
};

}  // namespace tensortap::detail
