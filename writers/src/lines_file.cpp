#include "writers/src/lines_file.h"

#include <fcntl.h>

#include <string_view>

#include "writers/src/dtypes.h"
#include "writers/src/json.h"

namespace tensortap::detail {

void append_index_line(std::string& out, const RecordDesc& meta, const std::string& location) {
  // By hand, not with fmt, and through a pointer: one line per record on
  // the writer thread.
  const std::string_view kind = kind_name(meta.kind);
  const std::string_view dtype = meta.dtype.name;
  const std::size_t room = 64 + kIntRoom + kind.size() + json_string_room(meta.name) + dtype.size() +
                           json_ints_room(meta.shape) + location.size();
  append_put(out, room, [&](char* p) {
    p = put(p, "{\"step\":");
    p = put_int(p, meta.step);
    p = put(p, ",\"kind\":\"");
    p = put(p, kind);
    p = put(p, "\",\"name\":");
    p = put_json_string(p, meta.name);
    p = put(p, ",\"dtype\":\"");
    p = put(p, dtype);
    p = put(p, "\",\"shape\":");
    p = put_json_ints(p, meta.shape);
    *p++ = ',';
    p = put(p, location);
    return put(p, "}\n");
  });
}

namespace {

// Room kept allocated past the end of a lines file, renewed once half of it
// is used: about 400 index lines.
constexpr std::uint64_t kReserveBytes = 64 << 10;

}  // namespace

LinesFile::LinesFile(const Dir& dir, const std::string& name)
    : file_(dir.open_file(name, O_WRONLY | O_CREAT | O_EXCL | O_APPEND)) {
  reserve();
}

LinesFile::~LinesFile() {
  // The room not used goes back; the file's size never included it.
  if (file_ && reserved_ > size_)
    (void)::fallocate(file_.fd(), FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, static_cast<off_t>(size_),
                      static_cast<off_t>(reserved_ - size_));
}

void LinesFile::reserve() noexcept {
  // Blocks allocated ahead, past the file's size (KEEP_SIZE): once the disk
  // is full, the lines of records already written (index.jsonl) and of dumps
  // still fit, where an append needing a new block would fail. Where the
  // file system cannot (no fallocate, or already full), nothing is reserved.
  if (size_ + kReserveBytes / 2 <= reserved_) return;
  if (::fallocate(file_.fd(), FALLOC_FL_KEEP_SIZE, static_cast<off_t>(size_), static_cast<off_t>(kReserveBytes)) == 0)
    reserved_ = size_ + kReserveBytes;
}

void LinesFile::append(const std::string& lines) {
  if (lines.empty()) return;
  try {
    if (torn_) {
      file_.write_all("\n", 1);
      ++size_;
      torn_ = false;
    }
    file_.write_all(lines.data(), lines.size());
    size_ += lines.size();
    reserve();
  } catch (...) {
    // A short write left part of a line: cut back to the whole lines.
    try {
      file_.truncate(size_);
    } catch (...) {
      torn_ = true;
    }
    throw;
  }
}

}  // namespace tensortap::detail
