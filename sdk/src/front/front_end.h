#pragma once

#include <atomic>
#include <cstdint>
#include <exception>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include <ATen/core/Tensor.h>

#include <tensortap/counters.h>
#include <tensortap/options.h>

#include "sdk/src/select/names.h"
#include "sdk/src/core/process.h"
#include "sdk/src/select/sampling.h"
#include "sdk/src/run/settings.h"

namespace tensortap {
class Recorder;
}  // namespace tensortap

namespace tensortap::detail {

class BackEnd;
class Failures;
class Snapshotter;
class Staging;

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
  /// How many of `params` (TensorImpl addresses) this watcher watches, and
  /// how many parameters it watches in all.
  virtual std::pair<std::size_t, std::size_t> watched_among(const std::unordered_set<const void*>& params) const {
    (void)params;
    return {0, 0};
  }
  /// Removes every hook; no hook calls the recorder afterwards.
  virtual void detach() noexcept = 0;
};

/// The pipeline's front end, behind a Recorder: what hooks and the training
/// loop call. It decides what is captured (Sampling, NameTable), snapshots
/// it (Snapshotter), applies the error policy, and drives the run's lifecycle;
/// the back side (the run's files, the writer thread, the copier, the
/// flight recorder) is `BackEnd`.
/// Hooks hold it by shared_ptr, so it outlives a Recorder that is destroyed
/// while a model still has a hook: such a hook finds it closed and does
/// nothing.
class FrontEnd {
 public:
  explicit FrontEnd(Options options);
  ~FrontEnd();
  FrontEnd(const FrontEnd&) = delete;
  FrontEnd& operator=(const FrontEnd&) = delete;

  // The hot path's first half: inline, one relaxed load when not sampled
  // (the fork check only on sampled steps).
  /// False before the first step, on steps not sampled, for kinds not
  /// captured, after close, and in a fork() child.
  bool active(Kind kind) const noexcept { return sampling_.active(kind) && !inert(); }
  /// True in a fork() child of the process that made this front end: every
  /// call returns at once there, and it is never destroyed (process.h).
  bool inert() const noexcept { return forked_since(fork_generation_); }
  /// Whether TENSORTAP=off made this recorder inert: watch() hooks nothing.
  bool off() const noexcept { return off_; }
  bool selected(const std::string& name) const { return sampling_.selected(name); }
  bool taps_sequential_child(const std::string& path) const { return sampling_.taps_sequential_child(path); }
  std::int64_t current_step() const noexcept { return sampling_.current_step(); }
  bool closed() const noexcept { return closed_.load(std::memory_order_acquire); }

  /// Snapshots `tensor` and queues it as record `name` (or `name#k` for the
  /// k-th repeat in `step`). Throws `Error` for tensors that cannot be
  /// stored. Does nothing once closed: a late hook must not fail.
  void record(Kind kind, const std::string& name, const at::Tensor& tensor, std::int64_t step) {
    const GivenName given = names_.repeat(kind, name, step);
    record_given(kind, given, tensor, step);
  }
  /// Runs `f` (a watcher's records at a step's end: the step's gradients)
  /// with this thread's CUDA records batched (Snapshotter::begin_batch,
  /// TENSORTAP_CUDA_BATCH=on); rethrows f's exception, or else the batch's.
  template <class F>
  void batched(F&& f) {
    begin_batch();
    std::exception_ptr first;
    try {
      f();
    } catch (...) {
      first = std::current_exception();
    }
    try {
      end_batch();
    } catch (...) {
      if (!first) first = std::current_exception();
    }
    if (first) std::rethrow_exception(first);
  }
  void begin_batch();
  void end_batch();
  /// Whether a parameter's gradient like `grad` is gathered at the end of
  /// each backward pass (`gather`) rather than copied by its hook: a dense
  /// CUDA tensor, with an engine that batches (TENSORTAP_CUDA_BATCH=on).
  bool gathers(const at::Tensor& grad) const noexcept;
  /// Copies each `from[i]` into `into[i]` (its dtype and size, contiguous):
  /// CUDA tensors in one launch a device (`cuda_gather`), others by ATen:
  /// the parameter hooks' accumulators (hooks/src/param_gather.cpp).
  void gather(const std::vector<at::Tensor>& from, std::vector<at::Tensor>& into);
  /// Tests only: CPU gradients are gathered too, so that the hooks' gather
  /// runs where there is no device.
  static void gather_on_cpu_for_tests(bool on) noexcept;
  /// Gradients `gather` has copied in this process: lets tests check that
  /// the hooks took that path.
  static std::uint64_t gathered() noexcept;
  /// As `record()`, under a name already given its repeat suffix.
  void record_as(Kind kind, const std::string& name, const at::Tensor& tensor, std::int64_t step);
  std::string repeat_name(Kind kind, const std::string& name, std::int64_t step) {
    return names_.repeat_name(kind, name, step);
  }
  std::string scoped(Kind kind, const std::string& name) const { return names_.scoped(kind, name); }
  /// What a hook does with an exception of its own: it never escapes into
  /// autograd or the training loop. It is counted and reported once, and
  /// with `OnError::Stop` capture stops and the next `step()` throws.
  void hook_failed(std::exception_ptr error) noexcept;

  // The Recorder's methods.
  /// `optimizer` identifies the optimizer `params` come from: the first
  /// call for one that holds no watched parameter says so on stderr.
  void record_grads(const std::unordered_set<const void*>& params, const void* optimizer);
  /// One tensor watch() found under several names (tied weights): recorded
  /// under `name` only, the others listed in run.json's "aliases".
  void add_aliases(const std::string& name, const std::vector<std::string>& others);
  /// The tap points watch() bound that declare a nonlinearity (name, word):
  /// run.json's "taps", and the live health rules.
  void add_taps(const std::vector<std::pair<std::string, std::string>>& taps);
  void push_scope(const std::string& name) {
    if (!inert()) names_.push_scope(name);
  }
  void pop_scope() noexcept {
    if (!inert()) names_.pop_scope();
  }
  void step(std::int64_t step);
  void capture(const std::string& name, const at::Tensor& tensor);
  void flush();
  void close();
  void dump();
  Counters counters() const;
  std::vector<Dump> dumps() const;
  const Options& options() const { return options_; }
  /// Where and as which rank this process writes.
  const Placement& placement() const { return placement_; }
  /// False on a rank `Options::ranks` leaves out.
  bool capturing() const { return back_ != nullptr; }

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
  // record_as() of a name the table gave, kept by reference when it is
  // the table's copy.
  void record_given(Kind kind, const GivenName& name, const at::Tensor& tensor, std::int64_t step);
  // record_as() of a copy of `name`.
  [[gnu::noinline]] void record_copy(Kind kind, const std::string& name, const at::Tensor& tensor, std::int64_t step);
  // Throws if called on one of this recorder's background threads (a
  // Trigger::when predicate runs on the writer thread): `call` would wait for
  // that very thread. Inline: step() and capture() ask it every time.
  void refuse_on_background_thread(const char* call) const {
    if (on_background_thread()) refuse(call);
  }
  [[noreturn]] void refuse(const char* call) const;
  // With OnError::Stop, throws once an error stopped capture.
  void check_stopped();
  // step(): applies what tensortap ctl asked (capture, every, pause,
  // resume) from `step` on, and hands the answers to the writer thread.
  void steer(std::int64_t step);
  // What flush() and close() throw after a background failure.
  std::string failure_message(std::int64_t errors, const std::string& first) const;

  // The fork generation this front end belongs to (process.h).
  const std::uint64_t fork_generation_ = fork_generation();
  // TENSORTAP=off: inert from the start (environment.h); what
  // TENSORTAP_OPTIONS said, applied to options_.
  const bool off_;
  std::optional<std::string> options_from_env_;
  const Options options_;
  const Placement placement_;
  Sampling sampling_;
  NameTable names_;
  // Behind pointers, so that hooks/, which includes this header, sees none
  // of the pipeline's headers.
  std::unique_ptr<Failures> failures_;
  std::atomic<bool> closed_{false};
  std::atomic<bool> stopped_{false};

  // step(), close() and the watcher list.
  // Optimizers record_grads() has checked for watched parameters; under
  // control_mu_.
  std::unordered_set<const void*> grads_checked_;
  std::mutex control_mu_;
  // Held for the whole of close(), so a second close() returns only once
  // the first has finished, with the same error.
  std::mutex close_mu_;
  std::string close_error_;
  std::vector<std::shared_ptr<Watcher>> watchers_;
  // What watch() calls hooked: object -> name, and kind byte + name.
  std::unordered_map<const void*, std::string> claimed_objects_;
  std::unordered_set<std::string> claimed_names_;

  std::unique_ptr<Staging> staging_;
  std::unique_ptr<Snapshotter> snapshotter_;
  // The writer thread and the run's files; null on a rank left out.
  std::unique_ptr<BackEnd> back_;
};

/// How watch() (hooks/) reaches a Recorder's front end; not for users.
struct RecorderAccess {
  // Defined in recorder.cpp, beside the class it opens: this header does
  // not include the facade it sits behind.
  static const std::shared_ptr<FrontEnd>& front_end(const Recorder& recorder);
};

}  // namespace tensortap::detail
