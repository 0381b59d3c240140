#include "sdk/src/pipeline/store.h"

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
  ++pending_records_;
  pending_bytes_ += static_cast<std::int64_t>(record.nbytes);
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
  }
  if (durable) write_index();
}

void Store::write_index() noexcept {
  if (pending_index_.empty()) return;
  try {
    index_->append(pending_index_);
    records_.fetch_add(pending_records_, std::memory_order_relaxed);
    bytes_.fetch_add(pending_bytes_, std::memory_order_relaxed);
  } catch (...) {
    // The index was cut back to its whole lines: these records are on disk
    // but no reader can find them. Each counts as failed.
    failures_.add(nullptr, fmt::format("{} ({} record(s) not indexed)", Failures::current(), pending_records_),
                  pending_records_);
  }
  pending_index_.clear();
  pending_records_ = 0;
  pending_bytes_ = 0;
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
  } else if (pending_records_ > 0) {
    failures_.add(nullptr, fmt::format("{} record(s) not durable when the file failed to close", pending_records_),
                  pending_records_);
    pending_index_.clear();
    pending_records_ = 0;
    pending_bytes_ = 0;
  }
  // A closed run holds no file: one recorder per epoch must not run the
  // process out of descriptors while the model (and its taps) lives on.
  writer_.reset();
  index_.reset();
}

}  // namespace tensortap::detail
