#pragma once

#include <sys/types.h>

// A run directory: the names tensortap writes there, holding it (open and
// locked) for one recorder, and rewriting its run.json safely.

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "writers/src/file.h"

namespace tensortap::detail {

/// The names tensortap writes in a run directory, and only those:
/// `Options::overwrite` removes them, and a directory that holds one of them
/// but no run is refused (a planted file or link, or a user's own file).
extern const char* const kRunFileNames[15];
/// TensorBoard's event files (`Options::tensorboard`) have names of their
/// own (writers/src/tensorboard/EVENTS.md): each name that starts with
/// `kEventsPrefix` and ends with `kEventsSuffix` is tensortap's as well.
extern const char* const kEventsPrefix;
extern const char* const kEventsSuffix;
bool is_event_file_name(const std::string& name);
/// Under `Budget::KeepLatest` the index is kept in segments: `index.jsonl`
/// (segment 0), then `index.<n>.jsonl` (n >= 1, decimal, no leading zero, 9
/// digits at most), each with its lines file's ballast
/// (`.index.<n>.jsonl.room`); tensortap's names as well.
std::string index_segment_name(std::uint32_t n);
bool is_index_segment_name(const std::string& name);
/// Files that roll (docs/design.md, "Leaving it on"): under KeepLatest the statistics'
/// segments `stats.<n>.npy` after `stats.npy`, and with a budget the one
/// older generation of the control answers and the dumps' lines,
/// `control.1.jsonl` and `dumps.1.jsonl` (with their ballasts).
bool is_rolled_file_name(const std::string& name);
/// `<stem>.<ext>` for n = 0, else `<stem>.<n>.<ext>`; and n of such a name
/// (n >= 1: decimal, no leading zero, 9 digits at most), none for another.
std::string numbered_name(std::string_view stem, std::string_view ext, std::uint32_t n);
std::optional<std::uint32_t> numbered_part(std::string_view name, std::string_view stem, std::string_view ext);
/// The names of `kRunFileNames`, the event files, the index's segments and
/// the rolled files that `dir` holds.
std::vector<std::string> run_files_in(const Dir& dir);

/// A run directory held by one recorder: open (so it stays the same
/// directory whatever `chdir()` or a rename does), locked against a second
/// writer in this process or another (an advisory lock the kernel drops when
/// a writer dies, so a crash never leaves it stuck), and emptied of an old
/// run when overwriting.
class RunDir {
 public:
  /// Opens `root` (created if missing) and, for a rank of a multi-rank run
  /// of `world_size` ranks, its subdirectory `sub` ("" for none). Throws
  /// `Error` naming the directory if another recorder holds it, if it (or
  /// `root`, in another layout: a single-rank run's files at the root, rank
  /// folders, rank folders past `world_size`) already holds a run and
  /// `overwrite` is off, or with the path and the OS error. With
  /// `overwrite`, those runs' files go, and only tensortap's files.
  RunDir(const std::string& root, const std::string& sub, bool overwrite, std::int64_t world_size = 1);
  const Dir& dir() const { return dir_; }
  /// Unlocks and closes the directory; for after the last write.
  void release() noexcept;

 private:
  static void clear_other_runs(const Dir& top, const std::string& sub, std::int64_t world_size, bool overwrite);

  // The lock's descriptor, closed in every fork() child at once
  // (run_dir.cpp): flock belongs to the open file description, which a
  // child shares, so a child outliving the parent's close() kept the
  // directory locked.
  class Lock {
   public:
    Lock() = default;
    Lock(const Lock&) = delete;
    Lock& operator=(const Lock&) = delete;
    ~Lock() { reset(); }
    /// Takes `file`, locked, and has fork() children close their copy.
    void hold(File file);
    void reset() noexcept;

   private:
    File file_;
    // The process that took the lock.
    pid_t owner_ = 0;
  };

  Dir dir_;
  Lock lock_;
};

/// Rewrites `run.json` in `dir` atomically with `json`, its whole text.
/// On a full disk, where no temporary fits, the file is rewritten in place,
/// in blocks reserved for that when it was written. What the text says is
/// the recorder's to render. Returns the bytes reserved (best effort).
/// `durable`: on disk when it returns, the directory's entry too (a disk
/// budget's "given_up_below", which must be there before any file goes).
std::uint64_t write_run_json(const Dir& dir, const std::string& json, bool durable = false);

/// Reserves blocks for `run.json` in `dir` up to `bytes`, its size kept, so
/// that a longer text still fits in place on a full disk. Best effort:
/// false where it could not.
bool reserve_run_json(const Dir& dir, std::uint64_t bytes) noexcept;

/// The current UTC time as ISO 8601 ("2026-11-21T05:45:00.123Z").
std::string utc_now();

}  // namespace tensortap::detail
