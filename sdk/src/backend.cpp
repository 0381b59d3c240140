#include "sdk/src/backend.h"

#include <algorithm>
#include <cstdio>
#include <optional>

#include <fmt/format.h>

namespace tensortap::detail {

Backend::Backend(Staging& staging, std::unique_ptr<Writer> writer, std::unique_ptr<LinesFile> index,
                 const Options& options, const Dir& dir, std::function<void(const DumpRecord&)> on_dump)
    : staging_(staging),
      writer_(std::move(writer)),
      index_(std::move(index)),
      stats_(dir),
      triggers_(options),
      after_dump_(options.after_dump()),
      on_dump_(std::move(on_dump)) {
  if (options.flight_recorder() > 0)
    ring_ = std::make_unique<FlightRing>(options.flight_recorder(), options.flight_recorder_bytes());
  thread_ = std::thread([this] { run(); });
}

Backend::~Backend() { stop(); }

void Backend::stop() {
  if (!thread_.joinable()) return;
  staging_.stop();
  thread_.join();
  std::lock_guard<std::mutex> lock(batch_mu_);
  stopped_ = true;
  flush_stats(/*durable=*/true);
  bool closed = true;
  try {
    writer_->close();
  } catch (...) {
    fail(nullptr, current_error());
    closed = false;
  }
  // After close() everything written is durable and may be indexed; if it
  // failed, records not yet indexed may not be readable: they failed.
  if (closed) {
    write_index();
  } else if (pending_records_ > 0) {
    fail(nullptr, fmt::format("{} record(s) not durable when the file failed to close", pending_records_),
         pending_records_);
    pending_index_.clear();
    pending_records_ = 0;
    pending_bytes_ = 0;
  }
  // A closed run holds no file: one recorder per epoch must not run the
  // process out of descriptors while the model (and its taps) lives on.
  writer_.reset();
  index_.reset();
  stats_.close();
}

void Backend::sync() {
  std::lock_guard<std::mutex> lock(batch_mu_);
  if (stopped_) return;
  flush_stats(/*durable=*/true);
  try {
    if (writer_->sync(/*force=*/true)) write_index();
  } catch (...) {
    fail(nullptr, current_error());
  }
}

std::string Backend::current_error() {
  try {
    throw;
  } catch (const std::exception& e) {
    return e.what();
  } catch (...) {
    // HDF5's C++ exceptions, among others, are not std::exceptions.
    return "an exception that is not a std::exception";
  }
}

void Backend::written(const RecordMeta& meta, const std::string& location) {
  append_index_line(pending_index_, meta, location);
  ++pending_records_;
  pending_bytes_ += static_cast<std::int64_t>(meta.nbytes);
}

void Backend::write_index() noexcept {
  if (pending_index_.empty()) return;
  try {
    index_->append(pending_index_);
    records_.fetch_add(pending_records_, std::memory_order_relaxed);
    bytes_.fetch_add(pending_bytes_, std::memory_order_relaxed);
  } catch (...) {
    // The index was cut back to its whole lines: these records are on disk
    // but no reader can find them. Each counts as failed.
    fail(nullptr, fmt::format("{} ({} record(s) not indexed)", current_error(), pending_records_), pending_records_);
  }
  pending_index_.clear();
  pending_records_ = 0;
  pending_bytes_ = 0;
}

void Backend::flush_stats(bool durable) noexcept {
  try {
    stats_.flush(durable);
  } catch (...) {
    fail(nullptr, current_error());
  }
}

std::string Backend::first_error() const {
  std::lock_guard<std::mutex> lock(error_mu_);
  return first_error_;
}

void Backend::fail(const RecordMeta* meta, const std::string& what, std::int64_t lost) noexcept {
  try {
    errors_.fetch_add(lost, std::memory_order_relaxed);
    any_failure_.store(true, std::memory_order_release);
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

void Backend::write_whole(const RecordMeta& meta, const char* data, std::size_t nbytes) {
  try {
    auto sink = writer_->begin(meta);
    sink->append(data, nbytes);
    written(meta, sink->finish());
  } catch (...) {
    fail(&meta, current_error());
  }
}

void Backend::finish_stats(const RecordMeta& meta, const TensorStats& stats) {
  if (meta.stats_row) {
    stats_.append(meta.kind, meta.name, meta.step, stats);
    stats_rows_.fetch_add(1, std::memory_order_relaxed);
  }
  if (triggers_.empty()) return;
  // A full tensor the flight recorder holds, on a step without statistics
  // rows, is only scanned for NaN and Inf: the other rules keep one value
  // per statistics step.
  TensorSummary s;
  s.step = meta.step;
  s.kind = meta.kind;
  s.name = meta.name;
  s.min = stats.min;
  s.max = stats.max;
  s.mean = stats.mean;
  s.std = stats.std;
  s.norm = stats.norm;
  s.nan = stats.nan;
  s.posinf = stats.posinf;
  s.neginf = stats.neginf;
  s.zeros = stats.zeros;
  s.numel = stats.numel;
  std::string error;
  std::optional<DumpRecord> fired = triggers_.evaluate(s, /*only_non_finite=*/!meta.stats_row, error);
  // A predicate that threw: an error under on_error, its rule off.
  if (!error.empty()) fail(nullptr, error, 0);
  if (fired) trigger(std::move(*fired));
}

void Backend::keep(HeldRecord record) {
  const RecordMeta& meta = *record.meta;
  if (window_lo_ <= meta.step && meta.step <= window_hi_) {
    writer_->prepare({&meta});
    write_whole(meta, record.bytes.data(), record.bytes.size());
    return;
  }
  if (halted_ && meta.step > window_hi_) return;
  // Larger than the budget allows next to the rest of its step: dropped
  // and counted like a record that found staging full.
  if (!ring_->hold(std::move(record))) flight_dropped_.fetch_add(1, std::memory_order_relaxed);
}

void Backend::trigger(DumpRecord dump) {
  if (!ring_) {
    // No flight recorder: the trigger only marks the run.
    on_dump_(dump);
    dumps_.fetch_add(1, std::memory_order_release);
    return;
  }
  if (halted_) return;
  const std::int64_t step = dump.step;
  std::vector<HeldRecord> held = ring_->take(step);
  dump.steps.push_back(step);
  std::vector<const RecordMeta*> metas;
  for (const HeldRecord& r : held) {
    dump.steps.push_back(r.meta->step);
    metas.push_back(r.meta.get());
  }
  std::sort(dump.steps.begin(), dump.steps.end());
  dump.steps.erase(std::unique(dump.steps.begin(), dump.steps.end()), dump.steps.end());
  window_lo_ = dump.steps.front();
  window_hi_ = dump.steps.back();
  try {
    writer_->prepare(metas);
  } catch (...) {
    fail(nullptr, current_error());
  }
  for (const HeldRecord& r : held) write_whole(*r.meta, r.bytes.data(), r.bytes.size());
  if (after_dump_ != AfterDump::Continue) halted_ = true;
  // What was dumped is made durable before the run says it was.
  bool durable = false;
  try {
    durable = writer_->sync(/*force=*/true);
  } catch (...) {
    fail(nullptr, current_error());
  }
  if (durable) write_index();
  // run.json lists the dump before step() can see the count and act on it.
  on_dump_(dump);
  dumps_.fetch_add(1, std::memory_order_release);
}

void Backend::write_slot(const Slot& slot, const char* base) {
  const RecordMeta& meta = *slot.meta;
  if (!slot.ok || failed_.count(slot.record) != 0) {
    // The copy into staging failed (the capturing thread got that error), or
    // an earlier chunk failed (counted then): drop the record.
    open_.erase(slot.record);
    accumulating_.erase(slot.record);
    holding_.erase(slot.record);
    if (slot.last) failed_.erase(slot.record);
    else failed_.insert(slot.record);
    return;
  }
  const char* data = base + slot.offset;
  const bool whole = slot.first && slot.last;
  try {
    if (meta.dump) {
      DumpRecord user;
      user.step = meta.step;
      user.trigger = "user";
      user.reason = "user";
      trigger(std::move(user));
      return;
    }
    if (meta.stats_vector) {
      finish_stats(meta, stats_from_vector(reinterpret_cast<const double*>(data)));
      return;
    }
    // Statistics first: a record the flight recorder holds is in the ring
    // before its own NaN triggers the dump that writes it.
    std::optional<TensorStats> stats;
    if (meta.stats_row || meta.check) {
      if (whole) {
        StatsAccumulator acc(meta.stored);
        acc.add(data, slot.nbytes);
        stats = acc.result();
      } else {
        auto it = accumulating_.try_emplace(slot.record, meta.stored).first;
        it->second.add(data, slot.nbytes);
        if (slot.last) {
          stats = it->second.result();
          accumulating_.erase(it);
        }
      }
    }
    if (meta.write && ring_) {
      if (whole) {
        keep(HeldRecord{slot.meta, std::string(data, slot.nbytes)});
      } else {
        HeldRecord& h = holding_[slot.record];
        if (slot.first) {
          h.meta = slot.meta;
          h.bytes.reserve(meta.nbytes);
        }
        h.bytes.append(data, slot.nbytes);
        if (slot.last) {
          HeldRecord done = std::move(h);
          holding_.erase(slot.record);
          keep(std::move(done));
        }
      }
    } else if (meta.write) {
      std::unique_ptr<RecordSink>* sink = nullptr;
      std::unique_ptr<RecordSink> single;
      if (whole) {
        single = writer_->begin(meta);
        sink = &single;
      } else {
        if (slot.first) open_[slot.record] = writer_->begin(meta);
        sink = &open_.at(slot.record);
      }
      (*sink)->append(data, slot.nbytes);
      if (slot.last) {
        const std::string location = (*sink)->finish();
        open_.erase(slot.record);
        written(meta, location);
      }
    }
    if (stats) finish_stats(meta, *stats);
  } catch (...) {
    const std::string what = current_error();
    open_.erase(slot.record);
    accumulating_.erase(slot.record);
    holding_.erase(slot.record);
    if (!slot.last) failed_.insert(slot.record);
    fail(&meta, what);
  }
}

void Backend::run() noexcept {
  std::vector<const RecordMeta*> starting;
  while (Staging::Buffer* buffer = staging_.take()) {
    try {
      write_batch(*buffer, starting);
    } catch (...) {
      // Out of memory, say: the batch's records are lost, and counted.
      fail(nullptr, current_error());
    }
    staging_.release(buffer);
  }
  holding_.clear();
  accumulating_.clear();
  open_.clear();  // a record cut off by stop() leaves only its temporary, removed here
}

void Backend::write_batch(const Staging::Buffer& buffer, std::vector<const RecordMeta*>& starting) {
  std::lock_guard<std::mutex> lock(batch_mu_);
  starting.clear();
  // Only what is written now: held records are prepared when dumped.
  for (const Slot& slot : buffer.slots)
    if (slot.first && slot.ok && slot.meta->write && !ring_) starting.push_back(slot.meta.get());
  try {
    writer_->prepare(starting);
  } catch (...) {
    fail(nullptr, current_error());
  }
  for (const Slot& slot : buffer.slots) write_slot(slot, buffer.data);
  // Index lines go out only once the records they name are durable: a
  // reader that follows the index always finds complete data.
  bool durable = false;
  try {
    durable = writer_->sync(/*force=*/false);
  } catch (...) {
    fail(nullptr, current_error());
  }
  if (durable) write_index();
  flush_stats(/*durable=*/false);
}

}  // namespace tensortap::detail
