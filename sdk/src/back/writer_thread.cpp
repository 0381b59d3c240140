#include "sdk/src/back/writer_thread.h"

#include <chrono>
#include <optional>

#include "sdk/src/core/process.h"

namespace tensortap::detail {

// How long the writer waits for a wake before it takes what was committed
// without one, and makes what it wrote durable and indexed (publish_idle):
// the bound on how late a paused run's last records appear (README, "Live
// in TensorBoard"). Captures wake the writer only when half a buffer fills
// (a wake per record would cost the training thread a futex call), and
// step() wakes it for the rest.
constexpr std::chrono::milliseconds kIdlePublish{500};

WriterThread::WriterThread(Staging& staging, Store& store, StatsFile& stats, FlightRecorder& flight, Failures& failures,
                           TensorBoard* tensorboard, DiskBudget* budget, std::function<void()> on_wake)
    : staging_(staging),
      store_(store),
      stats_(stats),
      flight_(flight),
      budget_(budget),
      failures_(failures),
      tensorboard_(tensorboard),
      on_wake_(std::move(on_wake)) {
  thread_ = std::thread([this] { run(); });
}

WriterThread::~WriterThread() { stop(); }

void WriterThread::stop() {
  if (!thread_.joinable()) return;
  staging_.stop();
  thread_.join();
  std::lock_guard<std::mutex> lock(batch_mu_);
  stopped_ = true;
  flush_stats(/*durable=*/true);
  store_.close();
  stats_.close();
  if (tensorboard_ != nullptr) to_tensorboard([&] { tensorboard_->close(); });
}

void WriterThread::sync() {
  std::lock_guard<std::mutex> lock(batch_mu_);
  if (stopped_) return;
  flush_stats(/*durable=*/true);
  store_.sync(/*force=*/true);
}

void WriterThread::flush_stats(bool durable) noexcept {
  try {
    stats_.flush(durable);
  } catch (...) {
    failures_.add(nullptr, Failures::current(), 0);
  }
  if (tensorboard_ != nullptr) to_tensorboard([&] { tensorboard_->flush(durable); });
}

template <typename F>
void WriterThread::to_tensorboard(F&& f) noexcept {
  try {
    f();
  } catch (...) {
    failures_.add(nullptr, Failures::current(), 0);
  }
}

void WriterThread::run() noexcept {
  // Recorder calls from here (a Trigger::when predicate) are refused: most
  // would wait for this thread (process.h).
  mark_background_thread();
  staging_.prepare();
  for (;;) {
    const std::optional<Staging::Buffer*> taken = staging_.take_within(kIdlePublish);
    if (!taken) {
      publish_idle();
      wake();
      continue;
    }
    Staging::Buffer* buffer = *taken;
    if (buffer == nullptr) break;
    wake();
    try {
      Staging::name_slots(*buffer);
      write_batch(*buffer);
    } catch (...) {
      // Out of memory, say: the batch's records are lost, and counted.
      failures_.add(nullptr, Failures::current(), 0);
    }
    // Again after a long batch, before its release lets flush() return: a
    // stall that a slow batch hid is seen with its waiting threads.
    wake();
    staging_.release(buffer);
  }
  // A record cut off by stop() leaves only its temporary, removed here.
  in_flight_.clear();
}

void WriterThread::wake() noexcept {
  if (!on_wake_) return;
  std::lock_guard<std::mutex> lock(batch_mu_);
  if (stopped_) return;
  try {
    on_wake_();
  } catch (...) {
    failures_.add(nullptr, Failures::current(), 0);
  }
}

void WriterThread::publish_idle() noexcept {
  // Index lines wait for their records to be durable, which a batch does
  // only at the format's interval (packed, HDF5): with nothing else to do,
  // the writer makes them durable now, so a paused run's last records are
  // indexed, visible to readers, within about a second of their capture.
  std::lock_guard<std::mutex> lock(batch_mu_);
  if (stopped_) return;
  store_.sync(/*force=*/true);
}

void WriterThread::write_batch(const Staging::Buffer& buffer) {
  std::lock_guard<std::mutex> lock(batch_mu_);
  if (budget_ != nullptr) budget_->measure();
  starting_.clear();
  // Only what is stored now: held records are prepared when dumped.
  for (const Slot& slot : buffer.slots)
    if (slot.first && slot.ok && slot.record.op == Op::Store) starting_.push_back(&slot.record.desc);
  store_.prepare(starting_);
  for (const Slot& slot : buffer.slots) write_slot(slot, buffer.data);
  store_.sync(/*force=*/false);
  flush_stats(/*durable=*/false);
}

void WriterThread::write_slot(const Slot& slot, const char* base) {
  // A whole record needs no entry; chunks of one share it.
  InFlight* open = slot.first && slot.last ? nullptr : &in_flight_[slot.id];
  if (!slot.ok || (open != nullptr && open->failed)) {
    // The copy into staging failed (the capturing thread got that error), or
    // an earlier chunk failed (counted then): drop the record.
    if (open != nullptr) {
      if (slot.last)
        in_flight_.erase(slot.id);
      else
        *open = InFlight{nullptr, nullptr, {}, /*failed=*/true, nullptr};
    }
    return;
  }
  try {
    apply(slot, base + slot.offset, open);
    if (open != nullptr && slot.last) in_flight_.erase(slot.id);
  } catch (...) {
    const std::string what = Failures::current();
    // A record whose store failed was counted then.
    const bool counted = open != nullptr && open->lost;
    if (open != nullptr) {
      if (slot.last)
        in_flight_.erase(slot.id);
      else
        *open = InFlight{nullptr, nullptr, {}, /*failed=*/true, nullptr};
    }
    if (!counted) failures_.add(slot.record.desc, what);
  }
}

void WriterThread::store(const Slot& slot, const char* data, InFlight* open) noexcept {
  const RecordDesc& desc = slot.record.desc;
  // A chunked record whose store failed is counted once; its later chunks
  // still feed the statistics and TensorBoard.
  if (open != nullptr && open->lost) return;
  try {
    if (open == nullptr) {
      auto sink = store_.begin(desc);
      sink->append(data, slot.nbytes);
      store_.written(desc, sink->finish());
      return;
    }
    if (slot.first) open->sink = store_.begin(desc);
    if (!open->sink) throw std::logic_error("a chunk arrived for a record that was never begun");
    open->sink->append(data, slot.nbytes);
    if (slot.last) {
      const std::string location = open->sink->finish();
      open->sink.reset();
      store_.written(desc, location);
    }
  } catch (const BudgetRefused&) {
    // Counted by the budget, not a failure. StopCapture: full capture
    // stops (the training thread's next captures take statistics at most);
    // KeepLatest goes on, giving up old steps for the next.
    if (budget_ != nullptr && budget_->reached()) flight_.halt_full_capture();
    if (open != nullptr) open->lost = true;
  } catch (...) {
    failures_.add(desc, Failures::current());
    if (open != nullptr) {
      open->lost = true;
      open->sink.reset();  // its stretch stays unindexed
    }
  }
}

bool WriterThread::side_files(std::int64_t step) {
  // A late record of a step given up (KeepLatest) adds no row or event:
  // the readers would hide them.
  if (budget_ == nullptr) return true;
  if (!budget_->side_files_allowed() || budget_->below_marker(step)) return false;
  budget_->side_written(step);
  return true;
}

void WriterThread::apply(const Slot& slot, const char* data, InFlight* open) {
  const Record& record = slot.record;
  const RecordDesc& desc = record.desc;
  const auto statistics_done = [&](const TensorStats& stats) {
    // Past a disk budget and its reserve, statistics and TensorBoard stop
    // too; the rules still see every record.
    if (record.has_row() && side_files(desc.step)) {
      stats_.append(desc.kind, desc.name, desc.step, stats);
      stats_rows_.fetch_add(1, std::memory_order_relaxed);
      if (tensorboard_ != nullptr) to_tensorboard([&] { tensorboard_->statistics(desc, stats); });
    }
    flight_.observe(desc, stats, record.has_row());
  };
  switch (record.op) {
    case Op::Dump: flight_.user_dump(desc.step); return;
    case Op::StatsVector: statistics_done(stats_from_vector(reinterpret_cast<const double*>(data))); return;
    case Op::Store:
    case Op::Hold:
    case Op::Stats: break;
  }
  // Statistics first: a record the flight recorder holds is in the ring
  // before its own NaN triggers the dump that writes it.
  std::optional<TensorStats> stats;
  if (record.computes_stats()) {
    if (open == nullptr) {
      StatsAccumulator acc(desc.dtype.element);
      acc.add(data, slot.nbytes);
      stats = acc.result();
    } else {
      if (!open->stats) open->stats = std::make_unique<StatsAccumulator>(desc.dtype.element);
      open->stats->add(data, slot.nbytes);
      if (slot.last) stats = open->stats->result();
    }
  }
  if (record.op == Op::Hold) {
    if (open == nullptr) {
      flight_.keep(HeldRecord{slot.record, std::string(data, slot.nbytes)});
    } else {
      if (slot.first) {
        open->held.record = slot.record;
        open->held.bytes.reserve(desc.nbytes);
      }
      open->held.bytes.append(data, slot.nbytes);
      if (slot.last) flight_.keep(std::move(open->held));
    }
  } else if (record.op == Op::Store) {
    store(slot, data, open);
  }
  // TensorBoard's part and the statistics do not depend on the store: a
  // full disk must not silence a rule (a NaN loss that stops training under
  // AfterDump::Throw), nor empty the statistics table and the charts, which
  // are often all that still fits.
  if (tensorboard_ != nullptr && side_files(desc.step)) {
    if (open == nullptr) {
      to_tensorboard([&] { tensorboard_->values(desc, data, slot.nbytes); });
    } else {
      to_tensorboard([&] {
        if (slot.first) open->histogram = tensorboard_->histogram_for(desc);
        if (!open->histogram) return;
        open->histogram->add(data, slot.nbytes);
        if (slot.last) tensorboard_->histogram_done(desc, *open->histogram);
      });
    }
  }
  if (stats) statistics_done(*stats);
}

}  // namespace tensortap::detail
