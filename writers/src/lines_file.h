#pragma once

// The JSON-lines files of a run (index.jsonl, stats_series.jsonl,
// dumps.jsonl): appending whole lines, the room kept for them on a full
// disk, and the index line of a record.

#include <cstdint>
#include <exception>
#include <string>
#include <string_view>

#include "writers/src/file.h"
#include "writers/src/writer.h"

namespace tensortap::detail {

/// The line index.jsonl gets for a record written at `location`.
void append_index_line(std::string& out, const RecordDesc& meta, const std::string& location);
/// At least the length of that line, whatever the format's location: what
/// the index must have room for before the record's bytes are written.
std::size_t index_line_room(const RecordDesc& meta);

/// A file of JSON lines (`index.jsonl`, `stats_series.jsonl`, `dumps.jsonl`)
/// opened for appending. It only ever holds whole lines: an append that
/// fails part way (a full disk) keeps the whole lines that went out and cuts
/// off the rest, so a later append never glues onto a torn one.
///
/// It keeps room for the lines to come, so that on a full disk the lines of
/// what was already written still fit: blocks allocated past the file's end
/// (fallocate, KEEP_SIZE), or, where the file system has no fallocate (ext2,
/// NFSv3), a ballast file `.<name>.room` in the same directory whose blocks
/// are given back when an append meets ENOSPC. `keep_room()` promises room;
/// the index asks for it before a record's bytes are written, so every record
/// on disk has its line.
class LinesFile {
 public:
  /// Creates `name` in `dir`; it must not exist yet.
  LinesFile(const Dir& dir, const std::string& name);
  ~LinesFile();
  LinesFile(const LinesFile&) = delete;
  LinesFile& operator=(const LinesFile&) = delete;

  /// What an append achieved: the bytes of whole lines written, and the
  /// error that stopped it (null when all went out).
  struct Appended {
    std::size_t bytes = 0;
    std::exception_ptr error;
  };
  /// Appends as many of `lines` (whole lines) as the disk takes. Never throws.
  Appended append_some(std::string_view lines) noexcept;
  /// Appends all of `lines` or throws (the whole lines that went out stay).
  void append(std::string_view lines);
  /// Makes sure `bytes` more can be appended on a full disk; throws `Error`
  /// (ENOSPC) naming the file if the disk has no room left for them.
  void keep_room(std::uint64_t bytes);
  void datasync() { file_.datasync(); }
  /// The bytes of the lines appended (the file's size).
  std::uint64_t size() const { return size_; }

  /// The ballast's name for a lines file `name` (in kRunFileNames).
  static std::string ballast_name(const std::string& name) { return "." + name + ".room"; }

 private:
  // The room that appends can still use without a new block.
  std::uint64_t room() const { return ballast_ ? ballast_size_ : reserved_ > size_ ? reserved_ - size_ : 0; }
  // Takes room for `bytes` more; false where the disk has none.
  bool grow(std::uint64_t bytes) noexcept;
  bool grow_ballast(std::uint64_t size) noexcept;
  // Gives back enough of the ballast's blocks for `bytes` of lines.
  void release_ballast(std::uint64_t bytes) noexcept;
  // After a failed append: the file is cut back to `size_`.
  void cut_back() noexcept;

  Dir dir_;
  std::string name_;
  File file_;
  std::uint64_t size_ = 0;
  // The file's blocks end here (fallocate KEEP_SIZE): appends up to it need
  // no new block.
  std::uint64_t reserved_ = 0;
  // Where fallocate is not supported: the ballast and its size.
  File ballast_;
  std::uint64_t ballast_size_ = 0;
  // A failed append could not be cut off: the next starts a new line.
  bool torn_ = false;
};

namespace testing {
/// Makes every lines file behave as on a file system without fallocate
/// (EOPNOTSUPP), so that the ballast is tested on any machine. Tests only.
void set_fallocate_unsupported(bool unsupported);
}  // namespace testing

}  // namespace tensortap::detail
