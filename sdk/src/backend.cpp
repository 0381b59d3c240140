#include "sdk/src/backend.h"

#include <cstdio>

#include <fmt/format.h>

namespace tensortap::detail {

Backend::Backend(Staging& staging, std::unique_ptr<Writer> writer, std::unique_ptr<IndexFile> index)
    : staging_(staging), writer_(std::move(writer)), index_(std::move(index)) {
  thread_ = std::thread([this] { run(); });
}

Backend::~Backend() { stop(); }

void Backend::stop() {
  if (!thread_.joinable()) return;
  staging_.stop();
  thread_.join();
  try {
    writer_->close();
  } catch (const std::exception& e) {
    fail(nullptr, e.what());
  }
}

std::string Backend::first_error() const {
  std::lock_guard<std::mutex> lock(error_mu_);
  return first_error_;
}

void Backend::fail(const RecordMeta* meta, const std::string& what) noexcept {
  try {
    errors_.fetch_add(1, std::memory_order_relaxed);
    std::string msg = meta == nullptr
                          ? what
                          : fmt::format("{} (record '{}', kind {}, step {})", what, meta->name,
                                        kind_name(meta->kind), meta->step);
    std::lock_guard<std::mutex> lock(error_mu_);
    if (first_error_.empty()) {
      first_error_ = std::move(msg);
      std::fprintf(stderr, "tensortap: error on the writer thread: %s (later errors are counted, not printed)\n",
                   first_error_.c_str());
    }
  } catch (...) {
    // Out of memory while reporting: the count above still says it failed.
  }
}

void Backend::write_slot(const Slot& slot, const char* base, std::string& index_lines) {
  const RecordMeta& meta = *slot.meta;
  const bool failed_before = failed_.count(slot.record) != 0;
  if (!slot.ok || failed_before) {
    // The copy into staging failed, now or for an earlier chunk: the record
    // is lost, and counted once.
    if (!failed_before) fail(&meta, "the copy into staging failed");
    open_.erase(slot.record);
    if (slot.last) failed_.erase(slot.record);
    else failed_.insert(slot.record);
    return;
  }
  try {
    std::unique_ptr<RecordSink>* sink = nullptr;
    std::unique_ptr<RecordSink> single;
    if (slot.first && slot.last) {
      single = writer_->begin(meta);
      sink = &single;
    } else {
      if (slot.first) open_[slot.record] = writer_->begin(meta);
      sink = &open_.at(slot.record);
    }
    (*sink)->append(base + slot.offset, slot.nbytes);
    if (slot.last) {
      const std::string location = (*sink)->finish();
      open_.erase(slot.record);
      append_index_line(index_lines, meta, location);
      records_.fetch_add(1, std::memory_order_relaxed);
      bytes_.fetch_add(static_cast<std::int64_t>(meta.nbytes), std::memory_order_relaxed);
    }
  } catch (const std::exception& e) {
    open_.erase(slot.record);
    if (!slot.last) failed_.insert(slot.record);
    fail(&meta, e.what());
  }
}

void Backend::run() noexcept {
  while (Staging::Buffer* buffer = staging_.take()) {
    std::string index_lines;
    for (const Slot& slot : buffer->slots) write_slot(slot, buffer->data, index_lines);
    // Index lines go out after the files they name are in place.
    if (!index_lines.empty()) {
      try {
        index_->append(index_lines);
      } catch (const std::exception& e) {
        fail(nullptr, e.what());
      }
    }
    staging_.release(buffer);
  }
  open_.clear();  // a record cut off by stop() leaves only its temporary, removed here
}

}  // namespace tensortap::detail
