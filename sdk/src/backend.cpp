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
  std::lock_guard<std::mutex> lock(batch_mu_);
  stopped_ = true;
  try {
    writer_->close();
  } catch (const std::exception& e) {
    fail(nullptr, e.what());
  }
  // After close() everything written is durable.
  write_index();
}

void Backend::sync() {
  std::lock_guard<std::mutex> lock(batch_mu_);
  if (stopped_) return;
  try {
    if (writer_->sync(/*force=*/true)) write_index();
  } catch (const std::exception& e) {
    fail(nullptr, e.what());
  }
}

void Backend::write_index() noexcept {
  if (pending_index_.empty()) return;
  try {
    index_->append(pending_index_);
  } catch (const std::exception& e) {
    fail(nullptr, e.what());
  }
  pending_index_.clear();
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
      std::fprintf(stderr, "tensortap: error: %s (later errors are counted, not printed)\n",
                   first_error_.c_str());
    }
  } catch (...) {
    // Out of memory while reporting: the count above still says it failed.
  }
}

void Backend::write_slot(const Slot& slot, const char* base) {
  const RecordMeta& meta = *slot.meta;
  if (!slot.ok || failed_.count(slot.record) != 0) {
    // The copy into staging failed (the capturing thread got that error), or
    // an earlier chunk failed (counted then): drop the record.
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
      append_index_line(pending_index_, meta, location);
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
  std::vector<const RecordMeta*> starting;
  while (Staging::Buffer* buffer = staging_.take()) {
    std::lock_guard<std::mutex> lock(batch_mu_);
    starting.clear();
    for (const Slot& slot : buffer->slots)
      if (slot.first && slot.ok) starting.push_back(slot.meta.get());
    try {
      writer_->prepare(starting);
    } catch (const std::exception& e) {
      fail(nullptr, e.what());
    }
    for (const Slot& slot : buffer->slots) write_slot(slot, buffer->data);
    // Index lines go out only once the records they name are durable: a
    // reader that follows the index always finds complete data.
    bool durable = false;
    try {
      durable = writer_->sync(/*force=*/false);
    } catch (const std::exception& e) {
      fail(nullptr, e.what());
    }
    if (durable) write_index();
    staging_.release(buffer);
  }
  open_.clear();  // a record cut off by stop() leaves only its temporary, removed here
}

}  // namespace tensortap::detail
