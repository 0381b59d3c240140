#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include <ATen/core/Tensor.h>

#include <tensortap/options.h>
#include <tensortap/recorder.h>

#include "sdk/src/backend.h"
#include "sdk/src/cuda/capture.h"
#include "sdk/src/pattern.h"
#include "sdk/src/run_json.h"
#include "sdk/src/staging.h"
#include "writers/src/run_files.h"

namespace tensortap::detail {

/// Something hooked into a model on the recorder's behalf (parameter hooks,
/// Tap bindings). The recorder tells it when steps begin and end, and
/// detaches it on close.
class Watcher {
 public:
  virtual ~Watcher() = default;
  /// After `step` became current.
  virtual void on_step_begin(std::int64_t step) { (void)step; }
  /// After the step that was current ended (at the next `step()` or at
  /// `close()`), before the recorder stops writing.
  virtual void on_step_end() {}
  /// Records, as kind `grad` in `step`, the current `.grad()` of each
  /// watched parameter in `params` (TensorImpl addresses), and leaves them
  /// out of the step's end-of-step gradient records.
  virtual void record_grads(const std::unordered_set<const void*>& params, std::int64_t step) {
    (void)params;
    (void)step;
  }
  /// Removes every hook; no hook calls the recorder afterwards.
  virtual void detach() noexcept = 0;
};

/// The state behind a Recorder. Hooks hold it by shared_ptr, so it outlives
/// a Recorder that is destroyed while a model still has a hook: such a hook
/// finds the core closed and does nothing.
class Core {
 public:
  explicit Core(Options options);
  ~Core();
  Core(const Core&) = delete;
  Core& operator=(const Core&) = delete;

  /// The hot-path test: one relaxed atomic load. False before the first
  /// step, on steps that are not sampled, for kinds not captured, and after
  /// close.
  bool active(Kind kind) const noexcept {
    // Either bit: the full tensor, or its statistics.
    const std::uint64_t bit = KindSet::bit(kind);
    return (state_.load(std::memory_order_relaxed) & (bit | bit << kStatsShift)) != 0;
  }
  /// Whether `name` passes the include and exclude patterns.
  bool selected(const std::string& name) const;
  /// Whether the Sequential child at `path` is to be made a tap point.
  bool taps_sequential_child(const std::string& path) const {
    return !tap_sequential_.empty() && tap_sequential_.search(path);
  }
  std::int64_t current_step() const noexcept {
    return static_cast<std::int64_t>(state_.load(std::memory_order_relaxed) >> kStepShift) - 1;
  }
  bool closed() const noexcept { return closed_.load(std::memory_order_acquire); }

  /// Snapshots `tensor` and queues it as record `name` (or `name#k` for the
  /// k-th repeat in `step`). Throws `Error` for tensors that cannot be
  /// stored. Does nothing once the core is closed: a late hook must not fail.
  void record(Kind kind, const std::string& name, const at::Tensor& tensor, std::int64_t step) {
    record_as(kind, repeat_name(kind, name, step), tensor, step);
  }
  /// `name` inside this thread's scopes (Recorder::scope) for kinds that
  /// scopes rename; `name` itself otherwise.
  std::string scoped(Kind kind, const std::string& name) const;
  /// As `record()`, under a name already given its repeat suffix.
  void record_as(Kind kind, std::string name, const at::Tensor& tensor, std::int64_t step);
  /// What a hook does with an exception of its own: it never escapes into
  /// autograd or the training loop. It is counted and reported once, and
  /// with `OnError::Stop` capture stops and the next `step()` throws.
  void hook_failed(std::exception_ptr error) noexcept;
  /// The name the next record of `name` in `step` gets: `name`, then
  /// `name#1`, `name#2`... Lets a gradient hook keep its forward's suffix
  /// whatever order backward runs in.
  std::string repeat_name(Kind kind, const std::string& name, std::int64_t step);

  // The Recorder's methods.
  void record_grads(const std::unordered_set<const void*>& params);
  void push_scope(const std::string& name);
  void pop_scope() noexcept;
  void step(std::int64_t step);
  void capture(const std::string& name, const at::Tensor& tensor);
  void flush();
  void close();
  void dump();
  Stats stats() const;
  std::vector<DumpRecord> dumps() const;
  const Options& options() const { return options_; }
  /// Where and as which rank this process writes.
  const RunInfo& info() const { return info_; }
  /// False on a rank `Options::ranks` leaves out.
  bool capturing() const { return backend_ != nullptr; }

  /// Adds a watcher; it is detached on close.
  void add_watcher(std::shared_ptr<Watcher> watcher);

  /// Something a watch() call hooks: a parameter (kind Grad), a buffer
  /// (kind Buffer) or a tap point (kind Activation), and its name.
  struct Claim {
    const void* object;
    Kind kind;
    std::string name;
  };
  /// Takes `claims` for one watch() call, or none of them: throws `Error`
  /// if the recorder is closed, if an object is watched already (a module
  /// watched twice would record everything twice), or if a name is taken by
  /// another object of its kind.
  void claim(const std::vector<Claim>& claims);

 private:
  void check_capturable(Kind kind, const std::string& name, const at::Tensor& t, std::int64_t step) const;
  // With OnError::Stop, throws once an error stopped capture.
  void check_stopped();
  void rethrow_background_error() const;
  // What flush() and close() throw after a background failure.
  std::string failure_message(std::int64_t errors, const std::string& first) const;
  // Full-tensor bits in the low byte, statistics bits in the next one.
  std::uint64_t plan(std::int64_t step) const;
  // What the flight recorder's dumps mean for the step about to begin.
  void after_dumps();
  // Called by the writer thread after a dump.
  void dumped(const DumpRecord& dump) noexcept;

  const Options options_;
  // Matched without backtracking: a hostile pattern or name cannot hang or
  // overflow the stack (see Pattern).
  Pattern include_;
  Pattern exclude_;
  Pattern tap_sequential_;
  const bool has_include_;
  const bool has_exclude_;
  // The most dimensions the run's format can store, and why.
  const std::int64_t max_dims_;
  const char* const max_dims_why_;
  // Whether full tensors the flight recorder holds are scanned for NaN and
  // Inf (the non_finite trigger).
  const bool scan_non_finite_;

  // The current step and which kinds it samples, in one word so a hook on
  // another thread never pairs one step's number with another's sampling:
  // (step + 1) << kStepShift | stats kind bits << kStatsShift | full kind
  // bits. 0 = before the first step.
  static constexpr unsigned kStatsShift = 8;
  static constexpr unsigned kStepShift = 16;
  static constexpr std::uint64_t kBitsMask = (std::uint64_t{1} << kStepShift) - 1;
  std::atomic<std::uint64_t> state_{0};
  std::atomic<bool> closed_{false};
  std::atomic<bool> stopped_{false};
  std::atomic<std::uint64_t> next_record_{0};
  std::atomic<std::int64_t> captured_{0};
  std::atomic<std::int64_t> dropped_{0};
  // Full capture ended by the flight recorder (AfterDump::StopCapture or
  // Throw); statistics go on.
  std::atomic<bool> full_halted_{false};
  // Dumps that step() has acted on.
  std::int64_t dumps_seen_ = 0;
  // The dumps as of the last step() (Recorder::dumps()); info_mu_.
  std::vector<DumpRecord> seen_dumps_;

  // step(), close() and the watcher list.
  std::mutex control_mu_;
  // Held for the whole of close(), so a second close() returns only once
  // the first has finished, with the same error.
  std::mutex close_mu_;
  std::string close_error_;
  std::vector<std::shared_ptr<Watcher>> watchers_;
  // What watch() calls hooked: object -> name, and kind byte + name.
  std::unordered_map<const void*, std::string> claimed_objects_;
  std::unordered_set<std::string> claimed_names_;

  // What is known of a base name: whether it is selected (for capture()),
  // and per kind the next repeat suffix in the current and the previous step
  // (a late gradient hook of the previous step still gets a fresh suffix).
  // Found by the caller's own string, so the common case, a name's first
  // record in a step, builds no string and allocates nothing.
  struct NameState {
    struct Count {
      std::int64_t step = -1;
      int next = 0;
    };
    std::int8_t selected = -1;  // -1: not looked up yet
    std::array<std::array<Count, 2>, kKindCount> counts{};  // [kind][slot]
  };
  // Names with a '#' given out in the current and the previous step, kind
  // byte first: the only ones a repeat's "name#k" can collide with (a name
  // the user captured as such, "h#1"). Empty unless there are repeats.
  struct TakenNames {
    std::int64_t step = -1;
    std::unordered_set<std::string> names;
  };
  // The repeat name of `name` in `step`; names_mu_ is held.
  std::string next_name(NameState& state, Kind kind, const std::string& name, std::int64_t step);

  std::mutex names_mu_;
  std::unordered_map<std::string, NameState> names_;
  TakenNames taken_[2];

  // info_'s dumps and its rewrites of run.json (the writer thread adds
  // dumps while training runs).
  mutable std::mutex info_mu_;
  RunInfo info_;
  // The run directory, open and locked from construction to close; before
  // backend_, whose writers write through it.
  std::unique_ptr<RunDir> run_dir_;
  Staging staging_;
  std::unique_ptr<Backend> backend_;
  // After backend_, so destroyed first: its copier thread feeds staging_
  // and reports to backend_. Null without CUDA (build or device).
  std::shared_ptr<CudaEngine> cuda_;
};

}  // namespace tensortap::detail
