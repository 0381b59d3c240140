#include "writers/src/lines_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
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

// At least the bytes put_json_string gives `s`: 1 a plain byte, 2 a quote
// or backslash, 6 a control byte or one past ASCII (\u00XX, \udcXX), a
// bound where UTF-8 passes through. Tighter than json_string_room's 6 a
// byte: the index keeps this much room per record on a full disk.
std::size_t json_string_bound(std::string_view s) {
  std::size_t n = 2;
  for (const char c : s) {
    const auto u = static_cast<unsigned char>(c);
    n += u < 0x20 || u >= 0x80 ? 6 : (c == '"' || c == '\\') ? 2 : 1;
  }
  return n;
}

}  // namespace

std::size_t index_line_room(const RecordDesc& meta) {
  // The line's own members as append_index_line counts them, and the
  // longest location a format gives: an HDF5 dataset path holds the name
  // JSON-escaped, an .npy path percent-encoded (3 bytes a byte).
  const std::size_t name = json_string_bound(meta.name);
  return 64 + kIntRoom + std::string_view(kind_name(meta.kind)).size() + name +
         std::string_view(meta.dtype.name).size() + json_ints_room(meta.shape) + 96 + 2 * kIntRoom +
         std::max(name, 3 * meta.name.size());
}

namespace {

// Room kept for a lines file beyond what the index promised, renewed once
// half of it is used: about 400 index lines.
constexpr std::uint64_t kReserveBytes = 64 << 10;
constexpr std::uint64_t kBlock = 4096;

std::atomic<bool> g_fallocate_unsupported{false};

std::uint64_t round_up(std::uint64_t n) { return (n + kBlock - 1) / kBlock * kBlock; }

// fallocate(), or EOPNOTSUPP where a test asks for a file system without it.
int allocate(int fd, int mode, std::uint64_t offset, std::uint64_t len) {
  if (g_fallocate_unsupported.load(std::memory_order_relaxed)) return EOPNOTSUPP;
  if (::fallocate(fd, mode, static_cast<off_t>(offset), static_cast<off_t>(len)) == 0) return 0;
  return errno;
}

}  // namespace

namespace testing {
void set_fallocate_unsupported(bool unsupported) { g_fallocate_unsupported.store(unsupported); }
}  // namespace testing

LinesFile::LinesFile(const Dir& dir, const std::string& name)
    : dir_(dir.dup()), name_(name), file_(dir.open_file(name, O_WRONLY | O_CREAT | O_EXCL | O_APPEND)) {
  (void)grow(kReserveBytes);
}

LinesFile::~LinesFile() {
  // The room not used goes back; the file's size never included it. A
  // truncate to the size it has, not a punched hole: ext4 punches nothing
  // past a file's end.
  if (file_ && reserved_ > size_) {
    try {
      file_.truncate(size_);
    } catch (...) {
      // Kept room is not data: a run keeps it, and `inspect --check` says so.
    }
  }
  if (ballast_) {
    ballast_ = File();
    try {
      dir_.unlink(ballast_name(name_));
    } catch (...) {
      // A ballast left behind is a file of the run's own names: overwrite
      // removes it, and `inspect --check` names it.
    }
  }
}

bool LinesFile::grow(std::uint64_t bytes) noexcept {
  // With headroom, so that a promise growing a line at a time takes the
  // file system's call once in a few hundred lines, not at each.
  const std::uint64_t want = round_up(std::max(bytes + kReserveBytes / 2, kReserveBytes));
  if (!ballast_) {
    const int err = allocate(file_.fd(), FALLOC_FL_KEEP_SIZE, size_, want);
    if (err == 0) {
      reserved_ = std::max(reserved_, size_ + want);
      return true;
    }
    if (err != EOPNOTSUPP && err != ENOSYS) return false;
    // No fallocate here (ext2, NFSv3): the room is a file of its own.
    try {
      ballast_ = dir_.open_file(ballast_name(name_), O_WRONLY | O_CREAT | O_TRUNC);
    } catch (...) {
      return false;
    }
    ballast_size_ = 0;
  }
  return grow_ballast(want);
}

bool LinesFile::grow_ballast(std::uint64_t size) noexcept {
  // Written, not allocated: without fallocate only a write takes blocks.
  static const char zeros[kReserveBytes] = {};
  while (ballast_size_ < size) {
    const std::size_t n = static_cast<std::size_t>(std::min<std::uint64_t>(sizeof zeros, size - ballast_size_));
    std::size_t written = 0;
    try {
      ballast_.pwrite_all(zeros, n, ballast_size_, &written);
    } catch (...) {
      ballast_size_ += written;
      return false;
    }
    ballast_size_ += written;
  }
  return true;
}

void LinesFile::release_ballast(std::uint64_t bytes) noexcept {
  // As much as the append still needs and a few blocks more (a file
  // system's own blocks for the file's growth), not all of it: the rest
  // stays promised to the lines after these.
  const std::uint64_t give = std::min(ballast_size_, round_up(bytes) + 4 * kBlock);
  try {
    ballast_.truncate(ballast_size_ - give);
    ballast_size_ -= give;
  } catch (...) {
    ballast_size_ = 0;
  }
}

void LinesFile::keep_room(std::uint64_t bytes) {
  if (room() >= bytes || grow(bytes)) return;
  throw_errno("keep room for the lines to come in", dir_.path_of(name_), ENOSPC);
}

LinesFile::Appended LinesFile::append_some(std::string_view lines) noexcept {
  Appended out;
  if (lines.empty()) return out;
  std::string_view rest = lines;
  std::string text;  // with the newline that ends a torn line first
  if (torn_) {
    text.reserve(lines.size() + 1);
    text += '\n';
    text += lines;
    rest = text;
  }
  const std::size_t lead = rest.size() - lines.size();
  const std::uint64_t ballast_before = ballast_size_;
  std::size_t done = 0;
  int err = 0;
  while (done < rest.size()) {
    const ssize_t n = ::write(file_.fd(), rest.data() + done, rest.size() - done);
    if (n >= 0) {
      done += static_cast<std::size_t>(n);
      continue;
    }
    if (errno == EINTR) continue;
    err = errno;
    // The ballast's blocks are what it kept for this moment.
    if (err == ENOSPC && ballast_ && ballast_size_ > 0) {
      release_ballast(rest.size() - done);
      continue;
    }
    break;
  }
  if (done == rest.size()) {
    size_ += done;
    torn_ = false;
    out.bytes = lines.size();
    // The ballast gave a few blocks more than these lines took: they are
    // free now, and taken back before the records' own writes take them, so
    // the lines still promised keep their room.
    if (ballast_ && ballast_size_ < ballast_before)
      (void)grow_ballast(ballast_before > done ? ballast_before - done : 0);
    if (room() < kReserveBytes / 2) (void)grow(kReserveBytes);
    return out;
  }
  // Keep the whole lines that went out, and cut off the rest.
  const std::size_t last = done <= lead ? std::string_view::npos : rest.substr(0, done).rfind('\n');
  const std::size_t whole = last == std::string_view::npos || last < lead ? 0 : last + 1;
  try {
    file_.truncate(size_ + whole);
    size_ += whole;
    if (whole > 0) torn_ = false;
  } catch (...) {
    size_ += done;
    torn_ = true;
  }
  // A truncate frees the blocks kept past the end too.
  reserved_ = std::min(reserved_, size_);
  out.bytes = whole > lead ? whole - lead : 0;
  try {
    throw_errno("write", dir_.path_of(name_), err);
  } catch (...) {
    out.error = std::current_exception();
  }
  return out;
}

void LinesFile::append(std::string_view lines) {
  const Appended r = append_some(lines);
  if (r.error) std::rethrow_exception(r.error);
}

}  // namespace tensortap::detail
