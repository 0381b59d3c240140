#include "writers/src/packed/writer.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <exception>

#include <fmt/format.h>

#include <tensortap/error.h>

#include "writers/src/check.h"
#include "writers/src/json.h"
#include "writers/src/npy/format.h"

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
  PackedSink(PackedWriter::Segment& segment, std::vector<PackedWriter::Finished>& finished, std::uint64_t offset,
             std::uint64_t header_bytes, std::uint64_t nbytes)
      : segment_(segment),
        finished_records_(finished),
        offset_(offset),
        cursor_(offset + header_bytes),
        left_(nbytes),
        nbytes_(header_bytes + nbytes) {}

  ~PackedSink() override {
    // Dropped before finish(): its stretch stays unindexed, the next record starts past it.
    if (!finished_) --segment_.live;
  }

  void append(const void* data, std::size_t n) override {
    if (n > left_)
      fail("record at offset {} of '{}' got more bytes than its shape holds", offset_, segment_.file.path());
    segment_.put(cursor_, static_cast<const char*>(data), n);
    cursor_ += n;
    left_ -= n;
  }

  std::string finish() override {
    if (left_ != 0) fail("record at offset {} of '{}' is {} bytes short", offset_, segment_.file.path(), left_);
    std::string loc;
    append_put(loc, 32 + json_string_room(segment_.rel) + 2 * kIntRoom, [&](char* p) {
      p = put(p, "\"file\":");
      p = put_json_string(p, segment_.rel);
      p = put(p, ",\"offset\":");
      p = put_int(p, static_cast<std::int64_t>(offset_));
      p = put(p, ",\"nbytes\":");
      return put_int(p, static_cast<std::int64_t>(nbytes_));
    });
    finished_records_.push_back(PackedWriter::Finished{segment_.number, offset_ + nbytes_});
    finished_ = true;
    --segment_.live;
    segment_.undurable = true;
    return loc;
  }

 private:
  // Outlives the sink: a segment is let go only once no record is live in it.
  PackedWriter::Segment& segment_;
  // The writer's list, which outlives every sink too.
  std::vector<PackedWriter::Finished>& finished_records_;
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

std::unique_ptr<PackedWriter::Segment> PackedWriter::open_segment() {
  if (!packed_) {
    packed_ = dir_.sub("packed", /*create=*/true);
    fsync_dir(dir_);
  }
  const std::string name = fmt::format("{:08d}.npys", next_segment_);
  auto s = std::make_unique<Segment>();
  // O_EXCL: a segment is only ever appended by the writer that created it
  // (overwrite removed packed/ with the old run).
  s->file = packed_.open_file(name, O_WRONLY | O_CREAT | O_EXCL);
  s->rel = "packed/" + name;
  s->number = next_segment_;
  ++next_segment_;
  return s;
}

void PackedWriter::close_segment(Segment& s) {
  // Its records are made durable before it goes, so sync() has only the
  // segments still open to think of.
  s.flush();
  if (s.undurable || s.new_entry) s.datasync(packed_);
  s.file.close();
  // Rolled past (its size set), with records: giving up steps may delete it.
  if (keep_latest_ && s.size > 0) closed_.push_back(Closed{s.rel, s.size, s.min_step, s.max_step});
}

void PackedWriter::keep_latest(std::uint64_t max_bytes) {
  keep_latest_ = true;
  cap_ = std::min<std::uint64_t>(options_.segment_bytes(), std::max<std::uint64_t>(max_bytes / 8, kAlign));
}

bool PackedWriter::holds_kept(const Closed& c, const std::set<std::int64_t>& kept) {
  auto it = kept.lower_bound(c.min_step);
  return it != kept.end() && *it <= c.max_step;
}

std::uint64_t PackedWriter::bytes_held_by(std::int64_t step) const {
  // A segment is held whole by any kept step its records span (holds_kept):
  // the closed ones by their size, those still open by what they hold.
  std::uint64_t n = 0;
  for (const Closed& c : closed_)
    if (c.min_step <= step && step <= c.max_step) n += c.size;
  for (const auto& s : retiring_)
    if (s->min_step <= step && step <= s->max_step) n += s->size;
  if (open_ && open_->min_step <= step && step <= open_->max_step) n += end_;
  return n;
}

Writer::GiveUp PackedWriter::plan_give_up(std::uint64_t want, std::int64_t from, std::int64_t limit,
                                          const std::set<std::int64_t>& kept) const {
  // The closed segments by their last step: giving up the steps below
  // that step + 1 deletes each segment up to it (and any before it).
  std::vector<const Closed*> order;
  for (const Closed& c : closed_)
    if (c.max_step < limit && !holds_kept(c, kept)) order.push_back(&c);
  std::sort(order.begin(), order.end(), [](const Closed* a, const Closed* b) { return a->max_step < b->max_step; });
  GiveUp g{from, 0};
  for (const Closed* c : order) {
    g.bytes += c->size;
    g.below = std::max(g.below, c->max_step + 1);
    if (g.bytes >= want) return g;
  }
  g.below = std::max(from, limit);
  return g;
}

std::uint64_t PackedWriter::give_up(std::int64_t below, const std::set<std::int64_t>& kept) {
  std::uint64_t freed = 0;
  std::exception_ptr first;
  for (auto it = closed_.begin(); it != closed_.end();) {
    if (it->max_step >= below || holds_kept(*it, kept)) {
      ++it;
      continue;
    }
    try {
      packed_.unlink(it->rel.substr(it->rel.find('/') + 1));
      rolled_bytes_ -= it->size;
      freed += it->size;
    } catch (...) {
      // It stays (counted, hidden all the same); the rest still go.
      if (!first) first = std::current_exception();
    }
    it = closed_.erase(it);
  }
  if (first) std::rethrow_exception(first);
  return freed;
}

void PackedWriter::close_retired() {
  for (auto it = retiring_.begin(); it != retiring_.end();) {
    if ((*it)->live != 0) {
      ++it;
      continue;
    }
    close_segment(**it);
    it = retiring_.erase(it);
  }
}

std::unique_ptr<RecordSink> PackedWriter::begin(const RecordDesc& meta) {
  // After a failed flush (a full disk) the records already gathered go out
  // first, or this one is refused now: the buffer would otherwise keep
  // taking records the disk cannot hold, and their index lines would crowd
  // out the room kept for those that can.
  if (open_ && open_->stalled) open_->flush();
  npy_header_into(header_, meta.dtype.element, meta.shape);
  const std::uint64_t size = header_.size() + meta.nbytes;
  if (!open_) {
    open_ = open_segment();
    end_ = 0;
  } else if (end_ > 0 && (cut_ || align_up(end_) + size > (keep_latest_ ? cap_ : options_.segment_bytes()) ||
                          (keep_latest_ && meta.step > open_->max_step && end_ >= cap_ / 2))) {
    // What could fail goes first, before the next segment exists: on a full
    // disk the record fails here, as every one after it will, and no new
    // segment (a file, a descriptor and a buffer) is opened per attempt. So
    // retiring_ holds at most the segments with records in flight, and one.
    open_->flush();
    close_retired();
    std::unique_ptr<Segment> next = open_segment();
    open_->size = end_;
    retiring_.push_back(std::move(open_));
    open_ = std::move(next);
    rolled_bytes_ += end_;
    end_ = 0;
    close_retired();
  }
  cut_ = false;
  const std::uint64_t offset = align_up(end_);
  open_->put(offset, header_.data(), header_.size());
  end_ = offset + size;
  ++open_->live;
  open_->min_step = std::min(open_->min_step, meta.step);
  open_->max_step = std::max(open_->max_step, meta.step);
  return std::make_unique<PackedSink>(*open_, finished_, offset, header_.size(), meta.nbytes);
}

void PackedWriter::Segment::put(std::uint64_t offset, const char* data, std::size_t n) {
  if (n == 0) return;
  if (offset < buf_start) {
    // Behind the buffer (another record's bytes went out meanwhile): straight to the file.
    file.pwrite_all(data, n, offset);
    return;
  }
  if (offset + n - buf_start > kBufferBytes) {
    flush();
    buf_start = offset;
    if (n > kBufferBytes) {
      // A large chunk needs no gathering.
      file.pwrite_all(data, n, offset);
      buf_start = offset + n;
      return;
    }
  }
  const auto at = static_cast<std::size_t>(offset - buf_start);
  // Gaps (the alignment padding) become zeros. Bytes usually arrive in
  // order, at the end; a record begun earlier may still fill its place.
  if (at > buf.size()) buf.append(at - buf.size(), '\0');
  const std::size_t inside = std::min(n, buf.size() - at);
  if (inside != 0) std::memcpy(&buf[at], data, inside);
  buf.append(data + inside, n - inside);
}

void PackedWriter::Segment::flush() {
  if (buf.empty()) return;
  // On failure (a full disk) what did not go out stays, and a later flush
  // writes it again at the same offsets: finished records in it are not
  // lost. What went out leaves the buffer, so the records wholly written
  // can be told apart (durable_after_failure).
  std::size_t written = 0;
  try {
    file.pwrite_all(buf.data(), buf.size(), buf_start, &written);
  } catch (...) {
    buf.erase(0, written);
    buf_start += written;
    stalled = true;
    throw;
  }
  buf_start += buf.size();
  buf.clear();
  stalled = false;
}

void PackedWriter::Segment::datasync(const Dir& packed) {
  file.datasync();
  if (new_entry) {
    fsync_dir(packed);
    new_entry = false;
  }
  undurable = false;
}

bool PackedWriter::sync(bool force) {
  bool undurable = false;
  each_segment([&](Segment& s) { undurable = undurable || s.undurable; });
  if (undurable) {
    // Written at every batch, so a process that dies loses nothing finished;
    // durable against a system crash at the cadence.
    each_segment([](Segment& s) { s.flush(); });
    if (!force && std::chrono::steady_clock::now() - last_sync_ < kSyncInterval) return false;
    each_segment([&](Segment& s) {
      if (s.undurable) s.datasync(packed_);
    });
    last_sync_ = std::chrono::steady_clock::now();
  }
  // A retiring segment whose last record was dropped, not finished, goes too.
  close_retired();
  finished_.clear();
  return true;
}

std::size_t PackedWriter::durable_after_failure() noexcept {
  // Everything behind a segment's buffer is in its file: made durable here,
  // each record wholly there may be indexed. A record still (partly) in a
  // buffer stops the count: index lines stay in the order records finished.
  try {
    each_segment([&](Segment& s) {
      if (!s.file) return;
      s.file.datasync();
      if (s.new_entry) {
        fsync_dir(packed_);
        s.new_entry = false;
      }
    });
  } catch (...) {
    return 0;
  }
  std::size_t n = 0;
  for (; n < finished_.size(); ++n) {
    const Finished& f = finished_[n];
    const Segment* held = nullptr;
    each_segment([&](Segment& s) {
      if (s.number == f.segment) held = &s;
    });
    // A segment no longer held, or closed, was made durable as it closed.
    if (held != nullptr && held->file && f.end > held->buf_start) break;
  }
  finished_.erase(finished_.begin(), finished_.begin() + static_cast<std::ptrdiff_t>(n));
  return n;
}

void PackedWriter::close() {
  // Every segment is closed, even after one fails (a full disk): the first
  // error is reported. A record still live here was cut off: its stretch
  // stays unindexed.
  std::exception_ptr first;
  each_segment([&](Segment& s) {
    if (!s.file) return;
    try {
      close_segment(s);
    } catch (...) {
      if (!first) first = std::current_exception();
    }
  });
  if (first) std::rethrow_exception(first);
  finished_.clear();
  packed_ = Dir();
}

}  // namespace tensortap::detail
