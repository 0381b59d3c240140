#include "writers/src/packed_writer.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include <fmt/format.h>

#include <tensortap/error.h>

#include "writers/src/check.h"
#include "writers/src/json.h"
#include "writers/src/npy_format.h"

namespace tensortap::detail {
namespace {

// Records start at multiples of this, so a mapped record's data (which its
// header pads to 64 bytes) is aligned for every dtype and for SIMD loads.
constexpr std::uint64_t kAlign = 64;
// Bytes gathered before they are written: small records share a write.
constexpr std::size_t kBufferBytes = std::size_t{4} << 20;
// Finished records are made durable (fdatasync) at least this often, so
// their index lines do not wait long; each sync costs a disk flush.
constexpr auto kSyncInterval = std::chrono::seconds(1);

std::uint64_t align_up(std::uint64_t n) { return (n + kAlign - 1) / kAlign * kAlign; }

void fsync_dir(const Dir& dir) {
  // A new file's name is durable only once its directory is.
  if (::fsync(dir.fd()) != 0 && errno != EINVAL) throw_errno("sync", dir.path(), errno);
}

class PackedSink final : public RecordSink {
 public:
  // The header is already in place: `begin()` wrote it.
  PackedSink(PackedWriter& writer, std::uint64_t offset, std::uint64_t header_bytes, std::uint64_t nbytes)
      : writer_(writer),
        offset_(offset),
        cursor_(offset + header_bytes),
        left_(nbytes),
        nbytes_(header_bytes + nbytes) {}

  ~PackedSink() override {
    // Dropped before finish(): its stretch stays unindexed, the next record starts past it.
    if (!finished_) writer_.release(false);
  }

  void append(const void* data, std::size_t n) override {
    if (n > left_)
      fail("record at offset {} of '{}' got more bytes than its shape holds", offset_, writer_.segment_path());
    writer_.put(cursor_, static_cast<const char*>(data), n);
    cursor_ += n;
    left_ -= n;
  }

  std::string finish() override {
    if (left_ != 0) fail("record at offset {} of '{}' is {} bytes short", offset_, writer_.segment_path(), left_);
    std::string loc;
    append_put(loc, 32 + json_string_room(writer_.segment_rel()) + 2 * kIntRoom, [&](char* p) {
      p = put(p, "\"file\":");
      p = put_json_string(p, writer_.segment_rel());
      p = put(p, ",\"offset\":");
      p = put_int(p, static_cast<std::int64_t>(offset_));
      p = put(p, ",\"nbytes\":");
      return put_int(p, static_cast<std::int64_t>(nbytes_));
    });
    finished_ = true;
    writer_.release(true);
    return loc;
  }

 private:
  PackedWriter& writer_;
  std::uint64_t offset_;
  std::uint64_t cursor_;
  std::uint64_t left_;
  std::uint64_t nbytes_;
  bool finished_ = false;
};

}  // namespace

// last_sync_ starts long ago: the first records are indexed at the first sync.
PackedWriter::PackedWriter(const Dir& dir, const PackedOptions& options) : dir_(dir), options_(options) {}

PackedWriter::~PackedWriter() = default;

void PackedWriter::open_segment() {
  if (!packed_) {
    packed_ = dir_.sub("packed", /*create=*/true);
    fsync_dir(dir_);
  }
  const std::string name = fmt::format("{:08d}.npys", next_segment_);
  // O_EXCL: a segment is only ever appended by the writer that created it
  // (overwrite removed packed/ with the old run).
  File f = packed_.open_file(name, O_WRONLY | O_CREAT | O_EXCL);
  ++next_segment_;
  file_ = std::move(f);
  rel_ = "packed/" + name;
  end_ = 0;
  buf_.clear();
  buf_start_ = 0;
  new_segment_ = true;
}

std::unique_ptr<RecordSink> PackedWriter::begin(const RecordDesc& meta) {
  npy_header_into(header_, meta.dtype.element, meta.shape);
  const std::uint64_t size = header_.size() + meta.nbytes;
  if (!file_) {
    open_segment();
  } else if (live_ == 0 && end_ > 0 && align_up(end_) + size > options_.segment_bytes()) {
    // The old segment is complete: make its records durable before letting it go,
    // so sync() only ever has the open segment to think of.
    flush();
    datasync();
    open_segment();
  }
  const std::uint64_t offset = align_up(end_);
  put(offset, header_.data(), header_.size());
  end_ = offset + size;
  ++live_;
  return std::make_unique<PackedSink>(*this, offset, header_.size(), meta.nbytes);
}

void PackedWriter::put(std::uint64_t offset, const char* data, std::size_t n) {
  if (n == 0) return;
  if (offset < buf_start_) {
    // Behind the buffer (another record's bytes went out meanwhile): straight to the file.
    file_.pwrite_all(data, n, offset);
    return;
  }
  if (offset + n - buf_start_ > kBufferBytes) {
    flush();
    buf_start_ = offset;
    if (n > kBufferBytes) {
      // A large chunk needs no gathering.
      file_.pwrite_all(data, n, offset);
      buf_start_ = offset + n;
      return;
    }
  }
  const auto at = static_cast<std::size_t>(offset - buf_start_);
  // Gaps (the alignment padding) become zeros. Bytes usually arrive in
  // order, at the end; a record begun earlier may still fill its place.
  if (at > buf_.size()) buf_.append(at - buf_.size(), '\0');
  const std::size_t inside = std::min(n, buf_.size() - at);
  if (inside != 0) std::memcpy(&buf_[at], data, inside);
  buf_.append(data + inside, n - inside);
}

void PackedWriter::release(bool done) {
  --live_;
  if (done) undurable_ = true;
}

void PackedWriter::flush() {
  if (buf_.empty()) return;
  // On failure (a full disk) the buffer stays, and a later flush writes it
  // again at the same offsets: finished records in it are not lost.
  file_.pwrite_all(buf_.data(), buf_.size(), buf_start_);
  buf_start_ += buf_.size();
  buf_.clear();
}

void PackedWriter::datasync() {
  file_.datasync();
  if (new_segment_) {
    fsync_dir(packed_);
    new_segment_ = false;
  }
  undurable_ = false;
  last_sync_ = std::chrono::steady_clock::now();
}

bool PackedWriter::sync(bool force) {
  if (!undurable_) return true;
  // Written at every batch, so a process that dies loses nothing finished;
  // durable against a system crash at the cadence.
  flush();
  if (!force && std::chrono::steady_clock::now() - last_sync_ < kSyncInterval) return false;
  datasync();
  return true;
}

void PackedWriter::close() {
  if (!file_) return;
  flush();
  datasync();
  file_.close();
  packed_ = Dir();
}

}  // namespace tensortap::detail
