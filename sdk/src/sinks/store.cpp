#include "sdk/src/sinks/store.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <exception>

#include <fmt/format.h>

#include "writers/src/run_dir.h"

namespace tensortap::detail {

Store::Store(std::unique_ptr<Writer> writer, std::unique_ptr<LinesFile> index, Failures& failures)
    : writer_(std::move(writer)), index_(std::move(index)), failures_(failures) {}

void Store::prepare(const std::vector<const RecordDesc*>& records) noexcept {
  try {
    writer_->prepare(records);
  } catch (...) {
    failures_.add(nullptr, Failures::current(), 0);
  }
}

namespace {

// A record's sink, holding the room its index line was promised until the
// record is written or given up.
class PromisedSink : public RecordSink {
 public:
  PromisedSink(std::unique_ptr<RecordSink> sink, std::uint64_t& promised, std::uint64_t room)
      : sink_(std::move(sink)), promised_(promised), room_(room) {}
  ~PromisedSink() override { promised_ -= room_; }
  void append(const void* data, std::size_t n) override { sink_->append(data, n); }
  std::string finish() override { return sink_->finish(); }

 private:
  std::unique_ptr<RecordSink> sink_;
  std::uint64_t& promised_;
  const std::uint64_t room_;
};

}  // namespace

std::unique_ptr<RecordSink> Store::begin(const RecordDesc& record) {
  // A disk budget comes first: a record it refuses costs no file.
  if (budget_ != nullptr && !budget_->admit(record.nbytes, record.step)) throw BudgetRefused{};
  const std::uint64_t room = index_line_room(record);
  index_->keep_room(pending_index_.size() + promised_ + room);
  auto sink = writer_->begin(record);
  promised_ += room;
  return std::make_unique<PromisedSink>(std::move(sink), promised_, room);
}

void Store::written(const RecordDesc& record, const std::string& location) {
  // A record that finished after its step was given up: its file goes at
  // the next give-up, and a line for it would only be hidden. It keeps its
  // place, with no line (the writer counts records finished in order).
  if (budget_ == nullptr || !budget_->given_up(record.step))
    append_index_line(pending_index_, record, location);
  pending_.push_back(Pending{pending_index_.size(), static_cast<std::int64_t>(record.nbytes), record.step});
  if (recent_steps_.insert(record.step).second && recent_steps_.size() > 64) recent_steps_.erase(recent_steps_.begin());
}

bool Store::write_whole(const RecordDesc& record, const char* data, std::size_t nbytes) noexcept {
  try {
    auto sink = begin(record);
    sink->append(data, nbytes);
    written(record, sink->finish());
    return true;
  } catch (const BudgetRefused&) {
    // Counted by the budget; not a failure.
  } catch (...) {
    failures_.add(record, Failures::current());
  }
  return false;
}

void Store::sync(bool force) noexcept {
  bool durable = false;
  try {
    durable = writer_->sync(force);
  } catch (...) {
    failures_.add(nullptr, Failures::current(), 0);
    index_survivors();
    return;
  }
  if (durable) write_index();
}

void Store::index_survivors() noexcept {
  // A full disk fails the writer's flush of its newest bytes; the records
  // already in the files must not wait on them (they would all count as
  // failed at close).
  const std::size_t n = writer_->durable_after_failure();
  if (n > 0) write_index(n);
}

void Store::write_index(std::size_t n) noexcept {
  n = std::min(n, pending_.size());
  if (n == 0) return;
  // The lines go out whole, as many as fit; those that did not stay
  // pending and are tried again at the next sync (the disk may free up),
  // and count as failed only if close() cannot write them either.
  const std::string_view lines(pending_index_);
  std::size_t done = 0;
  std::size_t at = 0;  // where record `done`'s line starts
  std::int64_t bytes = 0;
  std::exception_ptr error;
  bool rolls = segments_dir_ != nullptr;
  while (done < n && !error) {
    // KeepLatest: a segment takes lines up to its size (one at least), so
    // that a segment holds few steps and goes soon after they are given up.
    // If the next cannot be made (a full disk), this one takes the rest.
    if (rolls) rolls = roll_index();
    std::size_t last = n;
    if (rolls) {
      const std::uint64_t room = segment_bytes_ - std::min<std::uint64_t>(segment_bytes_, index_->size());
      last = done + 1;
      while (last < n && pending_[last].line_end - at <= room) ++last;
    }
    const LinesFile::Appended r = index_->append_some(lines.substr(at, pending_[last - 1].line_end - at));
    error = r.error;
    const std::size_t end = at + r.bytes;
    while (done < last && pending_[done].line_end <= end) {
      // A record given up before its line was written has none (give_up()).
      if (pending_[done].line_end > at) {
        segment_.min_step = std::min(segment_.min_step, pending_[done].step);
        segment_.max_step = std::max(segment_.max_step, pending_[done].step);
      }
      at = pending_[done].line_end;
      bytes += pending_[done++].bytes;
    }
    if (done < last) break;  // a line torn by an error: the rest waits
  }
  records_.fetch_add(static_cast<std::int64_t>(done), std::memory_order_relaxed);
  bytes_.fetch_add(bytes, std::memory_order_relaxed);
  if (error && !index_failed_) {
    index_failed_ = true;
    try {
      std::rethrow_exception(error);
    } catch (...) {
      failures_.add(nullptr, fmt::format("{} ({} record(s) not indexed yet)", Failures::current(), n - done), 0);
    }
  }
  if (!error) index_failed_ = false;
  const std::size_t cut = done == 0 ? 0 : pending_[done - 1].line_end;
  pending_index_.erase(0, cut);
  pending_.erase(pending_.begin(), pending_.begin() + static_cast<std::ptrdiff_t>(done));
  for (Pending& p : pending_) p.line_end -= cut;
}

void Store::keep_latest(const Dir& dir, std::uint64_t max_bytes) {
  writer_->keep_latest(max_bytes);
  segments_dir_ = &dir;
  // Small enough that the lines of steps given up go soon; large enough
  // that a segment is not a file per step.
  segment_bytes_ = std::max<std::uint64_t>(max_bytes / 64, 16384);
}

bool Store::roll_index() noexcept {
  if (segments_dir_ == nullptr || index_->size() < segment_bytes_) return true;
  const std::string name = index_segment_name(segment_.number + 1);
  try {
    auto next = std::make_unique<LinesFile>(*segments_dir_, name);
    try {
      // The room promised to the lines to come moves with them.
      next->keep_room(pending_index_.size() + promised_);
      // Its name on disk before lines that only it holds.
      if (::fsync(segments_dir_->fd()) != 0 && errno != EINVAL) throw_errno("sync", segments_dir_->path(), errno);
    } catch (...) {
      next.reset();
      segments_dir_->unlink(name);
      throw;
    }
    old_segments_.push_back(segment_);
    index_ = std::move(next);
    segment_ = IndexSegment{segment_.number + 1};
    return true;
  } catch (...) {
    // A full disk: the lines stay in this segment, which has their room.
    return false;
  }
}

void Store::drop_given_up_lines() {
  // The lines not written yet of the records given up: their files are
  // gone, and lines written for them would stay on disk (hidden) until
  // their segment goes, past the budget. Each keeps its place with no line
  // (the writer counts records finished in order) and, once its turn comes,
  // counts as written, like the given-up records already indexed.
  std::string lines;
  std::size_t start = 0;
  for (Pending& p : pending_) {
    if (budget_ == nullptr || !budget_->given_up(p.step)) lines.append(pending_index_, start, p.line_end - start);
    start = p.line_end;
    p.line_end = lines.size();
  }
  pending_index_ = std::move(lines);
}

void Store::make_durable_before_give_up() noexcept {
  // Packed makes a record's line wait up to a second for its segment to be
  // durable: without this, a give-up could delete every step whose lines
  // were written while the newest steps' lines still waited, and a job
  // killed then would read as empty. One sync batch a give-up, which frees
  // a 16th of the budget more than it needs: rare.
  try {
    drop_given_up_lines();
  } catch (...) {
    failures_.add(nullptr, Failures::current(), 0);
    return;
  }
  sync(/*force=*/true);
  if (!pending_.empty() || index_failed_) return;  // said by sync(); the give-up goes on
  try {
    index_->datasync();
  } catch (...) {
    failures_.add(nullptr, Failures::current(), 0);
  }
}

std::uint64_t Store::give_up(std::int64_t below, const std::set<std::int64_t>& kept) {
  // The index's segments go even when a record's file would not.
  std::exception_ptr first;
  std::uint64_t freed = 0;
  try {
    freed = writer_->give_up(below, kept);
  } catch (...) {
    first = std::current_exception();
  }
  drop_given_up_lines();
  for (auto it = old_segments_.begin(); it != old_segments_.end();) {
    const auto k = kept.lower_bound(it->min_step);
    if (it->max_step >= below || (k != kept.end() && *k <= it->max_step)) {
      ++it;
      continue;
    }
    try {
      segments_dir_->unlink(index_segment_name(it->number));
    } catch (...) {
      if (!first) first = std::current_exception();
    }
    it = old_segments_.erase(it);
  }
  if (first) std::rethrow_exception(first);
  return freed;
}

void Store::close() noexcept {
  bool closed = true;
  try {
    writer_->close();
  } catch (...) {
    failures_.add(nullptr, Failures::current(), 0);
    closed = false;
  }
  // After close() everything written is durable and may be indexed; if it
  // failed, records not yet indexed may not be readable: they failed.
  if (closed)
    write_index();
  else
    index_survivors();
  if (!pending_.empty()) {
    const auto lost = static_cast<std::int64_t>(pending_.size());
    failures_.add(nullptr,
                  closed ? fmt::format("{} record(s) written but never indexed: index.jsonl could not take their lines",
                                       lost)
                         : fmt::format("{} record(s) not durable when the file failed to close", lost),
                  lost);
    pending_index_.clear();
    pending_.clear();
  }
  // A closed run holds no file: one recorder per epoch must not run the
  // process out of descriptors while the model (and its taps) lives on.
  writer_.reset();
  index_.reset();
}

}  // namespace tensortap::detail
