#include "sdk/src/flight/flight.h"

#include <algorithm>
#include <limits>
#include <optional>
#include <set>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "writers/src/check.h"

namespace tensortap::detail {

FlightRecorder::FlightRecorder(const Options& options, Store& store, RunManifest& manifest, Failures& failures)
    : options_(options),
      store_(store),
      manifest_(manifest),
      failures_(failures),
      triggers_(options),
      halts_(options.flight_recorder() > 0 && options.after_dump() != AfterDump::Continue) {
  if (options.flight_recorder() > 0)
    ring_ = std::make_unique<FlightRing>(options.flight_recorder(), options.flight_recorder_bytes());
}

void FlightRecorder::observe(const RecordDesc& record, const TensorStats& stats, bool has_row) {
  if (triggers_.empty()) return;
  // A full tensor the flight recorder holds, on a step without statistics
  // rows, is only scanned for NaN and Inf: the other rules keep one value
  // per statistics step.
  TensorSummary s;
  s.step = record.step;
  s.kind = record.kind;
  s.name = record.name;
#define TENSORTAP_COPY_(name) s.name = stats.name;
  TENSORTAP_STATS_FIELDS(TENSORTAP_COPY_, TENSORTAP_COPY_)
#undef TENSORTAP_COPY_
  std::string error;
  std::vector<Dump> fired = triggers_.evaluate(s, /*only_non_finite=*/!has_row, error);
  // A predicate that threw: an error under on_error, its rule off.
  if (!error.empty()) failures_.add(nullptr, error, 0);
  // The first dumps the held steps; under StopCapture the rest are marks.
  for (Dump& d : fired) trigger(std::move(d));
}

void FlightRecorder::keep(HeldRecord held) {
  const RecordDesc& desc = held.record.desc;
  if (window_lo_ <= desc.step && desc.step <= window_hi_) {
    store_.prepare({&desc});
    store_.write_whole(desc, held.bytes.data(), held.bytes.size());
    return;
  }
  if (halted() && desc.step > window_hi_) return;
  // Larger than the budget allows next to the rest of its step: dropped
  // and counted like a record that found staging full.
  if (!ring_->hold(std::move(held))) dropped_.fetch_add(1, std::memory_order_relaxed);
}

void FlightRecorder::user_dump(std::int64_t step) {
  Dump user;
  user.step = step;
  user.trigger = "user";
  user.reason = "user";
  trigger(std::move(user));
}

Dump FlightRecorder::trigger(Dump dump, bool applies) {
  // After a dump that stopped the flight recorder: a mark, which acts on
  // nothing (capture is halted already; Throw threw for the first).
  if (ring_ && halted()) applies = false;
  if (ring_ && !halted()) {
    const std::int64_t step = dump.step;
    std::vector<HeldRecord> held = ring_->take(step);
    // The steps held, and the trigger's: its records still to come are
    // written as they come (the window), not held.
    std::vector<std::int64_t> steps{step};
    std::vector<const RecordDesc*> descs;
    for (const HeldRecord& r : held) {
      steps.push_back(r.record.desc.step);
      descs.push_back(&r.record.desc);
    }
    std::sort(steps.begin(), steps.end());
    steps.erase(std::unique(steps.begin(), steps.end()), steps.end());
    // Two dumps at one step (two rules on one row, under Continue) keep
    // the first's window: its late records still go to disk.
    window_lo_ = window_hi_ >= steps.front() ? std::min(window_lo_, steps.front()) : steps.front();
    window_hi_ = std::max(window_hi_, steps.back());
    // A dumped step stays whatever a disk budget gives up (KeepLatest),
    // within the dumps' share.
    store_.keep_steps(steps);
    store_.prepare(descs);
    std::set<std::int64_t> held_steps, written;
    for (const HeldRecord& r : held) {
      held_steps.insert(r.record.desc.step);
      if (store_.write_whole(r.record.desc, r.bytes.data(), r.bytes.size())) written.insert(r.record.desc.step);
    }
    store_.end_kept();
    // What was dumped is made durable before the run says it was.
    store_.sync(/*force=*/true);
    // The dump lists only steps it wrote, and says which it could not keep
    // and why: records the budget refused, or steps the dumps' share gave
    // up while this dump was written (its oldest, when it is larger).
    for (std::int64_t s : held_steps)
      (written.count(s) != 0 && !store_.given_up(s) ? dump.steps : dump.refused_steps).push_back(s);
    // The trigger's step, none of it held: listed if records of it were
    // stored already (a sampled step, a capture window), and kept with
    // them. Its records still to come go through the window, if that step
    // is captured at all, which the dump cannot know: not listed then.
    if (held_steps.count(step) == 0 && store_.stored(step) && !store_.given_up(step))
      dump.steps.insert(std::upper_bound(dump.steps.begin(), dump.steps.end(), step), step);
    if (!dump.refused_steps.empty()) dump.refused_reason = store_.dump_refusal();
  }
  // Without a flight recorder the trigger only marks the run. dumps.jsonl
  // has the dump on disk before step() can see the count and act on it.
  try {
    manifest_.add_dump(dump);
  } catch (...) {
    failures_.add(nullptr, Failures::current(), 0);
  }
  // TensorBoard shows the dump as text at its step: its dumps.jsonl line.
  if (tensorboard_ != nullptr) {
    try {
      std::string line;
      append_dump_json(line, dump);
      tensorboard_->text(dump.step, "tensortap/dumps", line);
    } catch (...) {
      failures_.add(nullptr, Failures::current(), 0);
    }
  }
  const std::int64_t n = dumps_.fetch_add(1, std::memory_order_release) + 1;
  if (applies) {
    last_applied_.store(static_cast<std::size_t>(n), std::memory_order_relaxed);
    applied_.fetch_add(1, std::memory_order_release);
  }
  return dump;
}

void FlightRecorder::on_step() {
  const std::int64_t dumps = this->dumps();
  if (dumps == seen_.load(std::memory_order_relaxed)) return;
  seen_.store(dumps, std::memory_order_relaxed);
  visible_.store(static_cast<std::size_t>(dumps), std::memory_order_relaxed);
  // Stall and request dumps are shown, never acted on.
  const std::int64_t applied = applied_.load(std::memory_order_acquire);
  if (applied == applied_seen_.load(std::memory_order_relaxed)) return;
  applied_seen_.store(applied, std::memory_order_relaxed);
  if (halts_) full_halted_.store(true, std::memory_order_relaxed);
  if (options_.after_dump() != AfterDump::Throw) return;
  // Without a flight recorder a trigger only marks the run: only Throw acts.
  const bool marked_only = !holds();
  // One dump copied, the last this step acts on: not the list.
  const Dump last = manifest_.last_dump(last_applied_.load(std::memory_order_relaxed));
  std::string why = last.trigger == "user"         ? std::string("Recorder::dump()")
                    : last.trigger == "non_finite" ? "a " + last.reason
                                                   : fmt::format("Trigger::{}", last.trigger);
  if (last.window > 0) why += fmt::format(" (value {} against a median of {})", last.value, last.median);
  fail("run '{}': {} after {} at step {}{} (Options::after_dump(Throw))", manifest_.run_dir(),
       marked_only ? std::string("a trigger fired")
                   : fmt::format("the flight recorder dumped steps {}", fmt::join(last.steps, ", ")),
       why, last.step, last.name.empty() ? "" : fmt::format(" in {} '{}'", kind_name(last.kind), last.name));
}

std::vector<Dump> FlightRecorder::seen() const {
  return manifest_.dumps(visible_.load(std::memory_order_relaxed));
}

void FlightRecorder::on_close() {
  // The writer thread has stopped: no dump is still to come, all are shown.
  visible_.store(std::numeric_limits<std::size_t>::max(), std::memory_order_relaxed);
}

}  // namespace tensortap::detail
