#include "sdk/src/front/front_end.h"

#include <algorithm>
#include <cstdio>

#include "sdk/src/core/failures.h"
#include "sdk/src/front/snapshotter.h"
#include "sdk/src/core/staging.h"
#include "sdk/src/back/back_end.h"
#include "sdk/src/cuda/capture.h"
#include "sdk/src/flight/triggers.h"
#include "sdk/src/run/environment.h"
#include "sdk/src/run/steer.h"
#include "writers/src/check.h"
#include "writers/src/kind_set_access.h"

namespace tensortap::detail {
namespace {

// Whether full tensors the flight recorder holds are scanned for NaN and
// Inf (the non_finite trigger).
bool scans_non_finite(const Options& o) { return o.flight_recorder() > 0 && Triggers(o).checks_non_finite(); }

// TENSORTAP=off, said once a process.
bool off_said() {
  static std::atomic<bool> said{false};
  if (!said.exchange(true))
    std::fprintf(stderr,
                 "tensortap: TENSORTAP=off: the recorders of this process record nothing (no directory, file, hook "
                 "or thread)\n");
  return true;
}

// The options as the code set them, overridden key by key by
// TENSORTAP_OPTIONS (kept in `text`), then settled.
Options from_environment(Options o, bool off, std::optional<std::string>& text) {
  if (off) return o;
  text = apply_environment(o);
  // Read again by the back end, which passes it to the CUDA engine; a bad
  // value is refused here, before a directory is made.
  (void)cuda_stats_in_arena();
  (void)cuda_batch();
  return settle(std::move(o));
}

}  // namespace

FrontEnd::FrontEnd(Options options)
    : off_(tensortap_off() && off_said()),
      options_(from_environment(std::move(options), off_, options_from_env_)),
      // An inert recorder (TENSORTAP=off) writes nowhere; it says the options' directory.
      placement_(off_ ? Placement{0, 1, options_.dir(), "", std::nullopt} : place(options_, options_from_env_)),
      sampling_(options_),
      failures_(std::make_unique<Failures>()),
      // Heap memory: the CUDA engine moves it to pinned memory once, from
      // its copier thread, if a CUDA tensor is ever captured.
      staging_(std::make_unique<Staging>(options_.buffer_bytes(), options_.overflow())),
      snapshotter_(std::make_unique<Snapshotter>(options_, *staging_, sampling_, closed_, options_.flight_recorder() > 0,
                                                 scans_non_finite(options_))) {
  const auto& only = options_.ranks();
  // A rank left out captures nothing and creates nothing: no directory, no
  // thread, no memory. Its hooks see no sampled step. TENSORTAP=off: the same
  // on every rank, and watch() hooks nothing.
  if (off_ || (!only.empty() && std::find(only.begin(), only.end(), placement_.rank) == only.end())) return;
  back_ = std::make_unique<BackEnd>(
      options_, placement_, *staging_, *failures_,
      BackEnd::FrontSide{[this] { return current_step(); }, [this] { return snapshotter_->dropped(); }});
  snapshotter_->open(back_->engine(), &back_->flight(), back_->space_fd(), placement_.run_dir);
}

void FrontEnd::record_as(Kind kind, const std::string& name, const at::Tensor& tensor, std::int64_t step) {
  snapshotter_->record(kind, name, tensor, step);
}

void FrontEnd::begin_batch() { snapshotter_->begin_batch(); }

void FrontEnd::end_batch() { snapshotter_->end_batch(); }

namespace {
std::atomic<bool> gather_on_cpu{false};
std::atomic<std::uint64_t> gathered_count{0};
}  // namespace

std::uint64_t FrontEnd::gathered() noexcept { return gathered_count.load(std::memory_order_relaxed); }

void FrontEnd::gather_on_cpu_for_tests(bool on) noexcept { gather_on_cpu.store(on, std::memory_order_relaxed); }

bool FrontEnd::gathers(const at::Tensor& grad) const noexcept {
  if (grad.is_sparse()) return false;
  if (inert()) return false;
  if (grad.is_cuda()) {
    const CudaEngine* engine = back_ ? back_->engine() : nullptr;
    return engine != nullptr && cuda_batches(*engine);
  }
  return grad.device().is_cpu() && gather_on_cpu.load(std::memory_order_relaxed);
}

void FrontEnd::gather(const std::vector<at::Tensor>& from, std::vector<at::Tensor>& into) {
  // The handles share the accumulators' storage: copied into in place.
  std::vector<at::Tensor> cuda_from, cuda_into;
  for (std::size_t i = 0; i < from.size(); ++i) {
    if (!from[i].is_cuda()) {
      into[i].copy_(from[i]);
      continue;
    }
    cuda_from.push_back(from[i]);
    cuda_into.push_back(into[i]);
  }
  if (!cuda_from.empty()) cuda_gather(cuda_from, cuda_into);
  gathered_count.fetch_add(from.size(), std::memory_order_relaxed);
}

void FrontEnd::record_given(Kind kind, const GivenName& name, const at::Tensor& tensor, std::int64_t step) {
  if (name.kept())
    snapshotter_->record(kind, name.str(), tensor, step, true);
  else
    record_copy(kind, name.str(), tensor, step);
}

void FrontEnd::record_copy(Kind kind, const std::string& name, const at::Tensor& tensor, std::int64_t step) {
  // A repeat's name is the thread's until its next one, and the capture may
  // run ATen ops whose op-capture hook names a record on this thread
  // (Options::capture_ops): a copy of its own, as before GivenName was two
  // words. Only repeats pay it; they built the string already. Out of line,
  // so the common case above carries no string to destroy (19 instructions
  // a record, callgrind).
  const std::string own = name;
  snapshotter_->record(kind, own, tensor, step, false);
}

FrontEnd::~FrontEnd() {
  try {
    close();
  } catch (...) {
    // The writer thread already reported it on stderr.
  }
}

void FrontEnd::refuse(const char* call) const {
  fail(
      "Recorder::{}() called on tensortap's writer thread (from a Trigger::when predicate?) of run '{}': it would "
      "wait for that thread itself; a predicate may only look at its TensorSummary (and call counters(), sampled() or "
      "current_step())",
      call, placement_.run_dir);
}

void FrontEnd::capture(const std::string& name, const at::Tensor& tensor) {
  // active() is false in a fork() child: the child check costs the sampled
  // path nothing more.
  if (!active(Kind::Tensor)) {
    if (inert()) return;
    refuse_on_background_thread("capture");
    TENSORTAP_CHECK(!closed(), "capture('{}') after close() of run '{}'", name, placement_.run_dir);
    TENSORTAP_CHECK(current_step() >= 0,
                    "capture('{}') before the first step(): call Recorder::step(s) at the start of each iteration",
                    name);
    return;
  }
  refuse_on_background_thread("capture");
  const std::int64_t step = current_step();
  const std::optional<GivenName> record_name = names_.capture_name(name, step, sampling_);
  if (!record_name) return;
  try {
    record_given(Kind::Tensor, *record_name, tensor, step);
  } catch (const NoRoom&) {
    // A full disk is not the caller's error (README, "Errors"): counted as
    // a failed record, as a Tap's would be. The caller's own still throw.
    hook_failed(std::current_exception());
  }
}

void FrontEnd::record_grads(const std::unordered_set<const void*>& params, const void* optimizer) {
  if (inert() || off_) return;  // TENSORTAP=off: its one line says all; a warning here would be false
  refuse_on_background_thread("record_grads");
  TENSORTAP_CHECK(!closed(), "record_grads() after close() of run '{}'", placement_.run_dir);
  const std::int64_t step = current_step();
  TENSORTAP_CHECK(step >= 0,
                  "record_grads() before the first step(): call Recorder::step(s) at the start of each iteration");
  std::lock_guard<std::mutex> lock(control_mu_);
  if (grads_checked_.insert(optimizer).second) {
    // Once per optimizer: one that trains nothing this recorder watches (a
    // module never watched, a TorchScript module) would record nothing, and
    // silently.
    std::size_t among = 0, watched = 0;
    for (const auto& w : watchers_) {
      const auto [a, n] = w->watched_among(params);
      among += a;
      watched += n;
    }
    if (among == 0)
      std::fprintf(stderr,
                   "tensortap: warning: run '%s': record_grads(): none of the optimizer's %zu parameters is one this "
                   "recorder watches (it watches %zu): nothing is recorded for it. watch() the module the optimizer "
                   "trains, under the same recorder\n",
                   placement_.run_dir.c_str(), params.size(), watched);
  }
  for (auto& w : watchers_) w->record_grads(params, step);
}

// What watch() found, for run.json (and the live rules: the taps).
void FrontEnd::add_aliases(const std::string& name, const std::vector<std::string>& others) {
  if (capturing() && !inert()) back_->add_aliases(name, others);
}
void FrontEnd::add_taps(const std::vector<std::pair<std::string, std::string>>& taps) {
  if (capturing() && !inert()) back_->add_taps(taps);
}

void FrontEnd::hook_failed(std::exception_ptr error) noexcept {
  std::string what = "unknown error in a hook";
  try {
    std::rethrow_exception(error);
  } catch (const std::exception& e) {
    what = e.what();
  } catch (...) {
  }
  if (capturing()) {
    // A record a hook could not hand over: captured, and failed.
    snapshotter_->count_lost();
    failures_->add(nullptr, what, 1);
  }
  if (options_.on_error() == OnError::Stop) {
    stopped_.store(true, std::memory_order_relaxed);
    sampling_.stop();
  }
}

void FrontEnd::check_stopped() {
  if (options_.on_error() != OnError::Stop || !capturing()) return;
  if (!stopped_.load(std::memory_order_relaxed) && !failures_->any()) return;
  stopped_.store(true, std::memory_order_relaxed);
  sampling_.stop();
  fail("run '{}': capture stopped after an error (Options::on_error(Stop)): {}", placement_.run_dir, failures_->first());
}

void FrontEnd::step(std::int64_t step) {
  if (inert()) return;
  refuse_on_background_thread("step");
  std::lock_guard<std::mutex> lock(control_mu_);
  TENSORTAP_CHECK(!closed(), "step({}) after close() of run '{}'", step, placement_.run_dir);
  const std::int64_t previous = current_step();
  TENSORTAP_CHECK(step >= 0, "step({}): steps must not be negative", step);
  TENSORTAP_CHECK(step < kMaxStep, "step({}): steps must be below 2^47", step);
  TENSORTAP_CHECK(step > previous, "step({}) after step({}): steps must increase", step, previous);
  check_stopped();
  if (capturing()) {
    back_->flight().on_step();
    // tensortap ctl: one relaxed load when nothing is asked.
    if (back_->control().pending()) steer(step);
  }
  sampling_.begin(step, capturing(), capturing() && back_->flight().capture_halted());
  // Watchers run hooks' work (committing gradients, snapshotting
  // parameters): their failures are hook failures, and every watcher runs.
  const auto guarded = [&](auto&& f) {
    try {
      f();
    } catch (...) {
      hook_failed(std::current_exception());
    }
  };
  if (previous >= 0)
    for (auto& w : watchers_) guarded([&] { w->on_step_end(); });
  for (auto& w : watchers_) guarded([&] { w->on_step_begin(step); });
  // The last step's CUDA snapshots to the copier, its records to the writer.
  if (CudaEngine* engine = back_ ? back_->engine() : nullptr) cuda_end_step(*engine);
  if (capturing()) staging_->kick();
  check_stopped();
}

void FrontEnd::steer(std::int64_t step) {
  Steering s = sampling_.steering() != nullptr ? *sampling_.steering() : Steering{};
  SteerState state;
  state.step = step;
  state.kinds = KindSetAccess::bits(options_.kinds());
  state.stopped = back_->monitoring_stopped();
  std::vector<ControlAnswer> answers;
  for (const ControlRequest& r : back_->control().take()) {
    // Asked at each request, as the writer thread may halt capture meanwhile.
    state.capture_halted = back_->flight().capture_halted();
    state.budget_reached = state.capture_halted && back_->budget_reached();
    if (std::optional<ControlAnswer> a = apply_request(s, r, state)) answers.push_back(std::move(*a));
  }
  sampling_.steer(s, step);
  back_->control().answered(std::move(answers));
}

std::vector<Dump> FrontEnd::dumps() const {
  return capturing() && !inert() ? back_->flight().seen() : std::vector<Dump>{};
}

void FrontEnd::dump() {
  if (inert()) return;
  refuse_on_background_thread("dump");
  TENSORTAP_CHECK(options_.flight_recorder() > 0,
                  "Recorder::dump() needs the flight recorder: set Options::flight_recorder(k)");
  TENSORTAP_CHECK(!closed(), "dump() after close() of run '{}'", placement_.run_dir);
  const std::int64_t step = current_step();
  TENSORTAP_CHECK(step >= 0, "dump() before the first step()");
  if (!capturing()) return;
  snapshotter_->dump_marker(step);
}

std::string FrontEnd::failure_message(std::int64_t errors, const std::string& first) const {
  if (errors == 0) return fmt::format("tensortap: run '{}': {}", placement_.run_dir, first);
  return fmt::format("tensortap: run '{}': {} record(s) failed; first: {}", placement_.run_dir, errors, first);
}

void FrontEnd::flush() {
  if (inert() || !capturing()) return;
  refuse_on_background_thread("flush");
  const Waits::Scope waiting(staging_->waits(), "flush()");
  back_->flush(/*index=*/!closed());
  const std::string err = failures_->first();
  if (!err.empty()) throw Error(failure_message(failures_->lost(), err));
}

void FrontEnd::close() {
  // A fork() child must not touch the parent's run: not its run.json, not
  // its threads or locks.
  if (inert()) return;
  refuse_on_background_thread("close");
  std::lock_guard<std::mutex> closing(close_mu_);
  if (closed()) {
    if (!close_error_.empty()) throw Error(close_error_);
    return;
  }
  {
    std::lock_guard<std::mutex> lock(control_mu_);
    // Commit the last step's gradients while captures are still accepted.
    if (current_step() >= 0)
      for (auto& w : watchers_) {
        try {
          w->on_step_end();
        } catch (...) {
          hook_failed(std::current_exception());
        }
      }
    sampling_.stop();
    closed_.store(true, std::memory_order_release);
    for (auto& w : watchers_) w->detach();
    watchers_.clear();
  }
  if (!capturing()) return;
  const Waits::Scope waiting(staging_->waits(), "close()");
  back_->stop();
  // Hooks (Taps above all) may keep this object alive as long as the model:
  // give the staging memory back now.
  staging_->free_memory();
  const Counters final_counters = counters();
  const std::string first_error = failures_->first();
  try {
    back_->close(final_counters, first_error);
  } catch (const std::exception& e) {
    close_error_ = e.what();
  }
  if (!first_error.empty()) close_error_ = failure_message(final_counters.errors, first_error);
  if (!close_error_.empty()) throw Error(close_error_);
}

Counters FrontEnd::counters() const {
  Counters s;
  if (!capturing() || inert()) return s;
  s.captured = snapshotter_->captured();
  s.records = back_->records();
  s.bytes = back_->bytes();
  s.dropped = snapshotter_->dropped() + back_->flight().dropped();
  s.errors = failures_->lost();
  s.stats_rows = back_->stats_rows();
  s.dumps = back_->flight().dumps();
  s.blocked_seconds = staging_->blocked_seconds();
  s.budget_refused = back_->budget_refused();
  return s;
}

void FrontEnd::claim(const std::vector<Claim>& claims) {
  TENSORTAP_CHECK(!inert(),
                  "watch() in a fork() child on a recorder of the parent process (run '{}'): it is inert there; "
                  "make a Recorder of the child's own",
                  placement_.run_dir);
  refuse_on_background_thread("watch");
  std::lock_guard<std::mutex> lock(control_mu_);
  TENSORTAP_CHECK(!closed(), "watch() on the closed recorder of run '{}'", placement_.run_dir);
  std::unordered_set<std::string> names;
  std::unordered_set<const void*> objects;
  for (const Claim& c : claims) {
    const char* what = c.kind == Kind::Grad ? "parameter" : c.kind == Kind::Buffer ? "buffer" : "tap point";
    if (auto it = claimed_objects_.find(c.object); it != claimed_objects_.end())
      fail(
          "watch(): the {} '{}' is already watched by this recorder (as '{}', run '{}'); watching a module twice "
          "would record everything twice",
          what, c.name, it->second, placement_.run_dir);
    std::string key(1, static_cast<char>(c.kind));
    key += c.name;
    // Within one call a tied weight may appear under two names; across
    // calls, one name for two objects would mix their records.
    if (objects.insert(c.object).second && claimed_names_.count(key) != 0)
      fail(
          "watch(): a {} named '{}' is already watched by this recorder (run '{}'); give the second module a "
          "prefix: tensortap::watch(module, recorder, \"G\")",
          what, c.name, placement_.run_dir);
    names.insert(std::move(key));
  }
  for (const Claim& c : claims) claimed_objects_.emplace(c.object, c.name);
  claimed_names_.insert(names.begin(), names.end());
}

void FrontEnd::add_watcher(std::shared_ptr<Watcher> watcher) {
  std::lock_guard<std::mutex> lock(control_mu_);
  if (closed()) {
    watcher->detach();
    return;
  }
  watchers_.push_back(std::move(watcher));
}

}  // namespace tensortap::detail
