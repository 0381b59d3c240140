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

void Store::written(const RecordDesc& record, const std::string& location) {
  append_index_line(pending_index_, record, location);
  pending_.push_back(Pending{pending_index_.size(), static_cast<std::int64_t>(record.nbytes)});
}

void Store::write_whole(const RecordDesc& record, const char* data, std::size_t nbytes) noexcept {
  try {
    auto sink = writer_->begin(record);
    sink->append(data, nbytes);
    written(record, sink->finish());
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
  std::int64_t bytes = 0;
  for (std::size_t i = 0; i < n; ++i) bytes += pending_[i].bytes;
  const auto records = static_cast<std::int64_t>(n);
  try {
    index_->append(n == pending_.size() ? pending_index_ : pending_index_.substr(0, end));
    records_.fetch_add(records, std::memory_order_relaxed);
    bytes_.fetch_add(bytes, std::memory_order_relaxed);
  } catch (...) {
    // The index was cut back to its whole lines: these records are on disk
    // but no reader can find them. Each counts as failed.
    failures_.add(nullptr, fmt::format("{} ({} record(s) not indexed)", Failures::current(), records), records);
  }
  pending_index_.erase(0, end);
  pending_.erase(pending_.begin(), pending_.begin() + static_cast<std::ptrdiff_t>(n));
  for (Pending& p : pending_) p.line_end -= end;
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
  if (closed) {
    write_index();
  } else {
    index_survivors();
    if (!pending_.empty()) {
      const auto lost = static_cast<std::int64_t>(pending_.size());
      failures_.add(nullptr, fmt::format("{} record(s) not durable when the file failed to close", lost), lost);
      pending_index_.clear();
      pending_.clear();
    }
  }
  // A closed run holds no file: one recorder per epoch must not run the
  // process out of descriptors while the model (and its taps) lives on.
  writer_.reset();
  index_.reset();
}

}  // namespace tensortap::detail
