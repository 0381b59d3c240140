#include "sdk/src/pipeline/store.h"

#include <algorithm>

#include <fmt/format.h>

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
  append_index_line(pending_index_, record, location);
  pending_.push_back(Pending{pending_index_.size(), static_cast<std::int64_t>(record.nbytes)});
}

void Store::write_whole(const RecordDesc& record, const char* data, std::size_t nbytes) noexcept {
  try {
    auto sink = begin(record);
    sink->append(data, nbytes);
    written(record, sink->finish());
  } catch (const BudgetRefused&) {
    // Counted by the budget; not a failure.
  } catch (...) {
    failures_.add(record, Failures::current());
  }
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
  const std::size_t end = pending_[n - 1].line_end;
  // The lines go out whole, as many as fit; those that did not stay
  // pending and are tried again at the next sync (the disk may free up),
  // and count as failed only if close() cannot write them either.
  const LinesFile::Appended r = index_->append_some(std::string_view(pending_index_).substr(0, end));
  std::size_t done = 0;
  std::int64_t bytes = 0;
  while (done < n && pending_[done].line_end <= r.bytes) bytes += pending_[done++].bytes;
  records_.fetch_add(static_cast<std::int64_t>(done), std::memory_order_relaxed);
  bytes_.fetch_add(bytes, std::memory_order_relaxed);
  if (r.error && !index_failed_) {
    index_failed_ = true;
    try {
      std::rethrow_exception(r.error);
    } catch (...) {
      failures_.add(nullptr, fmt::format("{} ({} record(s) not indexed yet)", Failures::current(), n - done), 0);
    }
  }
  if (!r.error) index_failed_ = false;
  const std::size_t cut = done == 0 ? 0 : pending_[done - 1].line_end;
  pending_index_.erase(0, cut);
  pending_.erase(pending_.begin(), pending_.begin() + static_cast<std::ptrdiff_t>(done));
  for (Pending& p : pending_) p.line_end -= cut;
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
