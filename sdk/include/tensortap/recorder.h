#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include <tensortap/counters.h>
#include <tensortap/error.h>
#include <tensortap/options.h>

namespace tensortap {

namespace detail {
class FrontEnd;
struct RecorderAccess;
}  // namespace detail

}  // namespace tensortap

namespace torch::optim {
class Optimizer;
}  // namespace torch::optim

namespace tensortap {

/// The name `Counters` had before 0.2 (it read as "statistics", which are
/// `Options::stats_every`'s); it goes in the release after.
using Stats [[deprecated("tensortap::Stats is now tensortap::Counters")]] = Counters;

/// Owns the hooks, the staging memory and the writer thread of one run.
///
/// A recorder snapshots tensors on the calling thread (a copy into a staging
/// buffer) and writes them on its own writer thread, so training never waits
/// for the disk unless staging is full and the policy is `Overflow::Block`.
/// All methods may be called from any thread, with two exceptions:
/// - On tensortap's own writer thread (where a `Trigger::when` predicate
///   runs), `step`, `capture`, `record_grads`, `flush`, `close`, `dump` and
///   `watch` throw `Error`: each could wait for that very thread. `counters`,
///   `sampled` and `current_step` work there.
/// - In a `fork()` child of the process that made it (a data-loading worker,
///   a `system()`), a recorder is inert: every call returns at once and does
///   nothing (`counters()` is all zeros, `watch` throws), it writes nothing and
///   touches none of the parent's files, its hooks capture nothing, and its
///   destructor returns without freeing it (the parent's threads, which it
///   would wait for, do not exist in the child). A recorder made in the child
///   works as any other.
///
/// Example:
/// ```
/// auto rec = std::make_shared<tensortap::Recorder>(
///     tensortap::Options("runs/exp1").every(10));
/// for (int64_t step = 0; step < 100; ++step) {
///   rec->step(step);
///   rec->capture("input", x);   // written on steps 0, 10, 20, ...
/// }
/// rec->close();
/// ```
/// `tensortap::watch()` builds one and hooks it into a module.
class Recorder {
 public:
  /// Creates the run directory and writes `run.json`. Throws `Error` naming
  /// the path and the OS error if it cannot, and if the directory already
  /// holds a run and `overwrite` is off.
  explicit Recorder(Options options);
  /// Closes the run without throwing; an error is reported on stderr.
  ~Recorder();

  Recorder(const Recorder&) = delete;
  Recorder& operator=(const Recorder&) = delete;

  /// Starts iteration `step` and decides whether it is sampled. Ends the
  /// previous step, which commits its accumulated parameter gradients. Steps
  /// must increase; throws `Error` otherwise.
  void step(std::int64_t step);

  /// Captures `tensor` under `name` (kind `tensor`) if the current step is
  /// sampled and the name selected. The values are copied before this
  /// returns. A second capture of the same name within a step is recorded as
  /// `name#1`, the next `name#2`, and so on. Throws `Error` for tensors that
  /// cannot be stored (undefined, sparse, quantized, meta, no NumPy dtype),
  /// before the first `step()`, and after `close()`.
  void capture(const std::string& name, const at::Tensor& tensor);

  /// Records, as kind `grad`, the gradient each watched parameter that
  /// `optimizer` holds has now: exactly what its `step()` is about to
  /// apply. Call it just before `optimizer.step()`. In loops with several
  /// optimizers (a GAN, actor-critic), a step's end-of-step `grad` record,
  /// the sum of all its backward passes, is not what each optimizer
  /// applied; once `record_grads` has recorded a parameter in a step, no
  /// end-of-step record is written for it, and later backward passes in
  /// the step are not added. Does nothing on a step that does not sample
  /// gradients. Throws `Error` before the first `step()` and after
  /// `close()`. The first call for an optimizer none of whose parameters
  /// this recorder watches warns on stderr.
  ///
  /// Hook order: the default `grad` record is taken by the hook `watch()`
  /// registers, so a gradient hook of the user's registered before
  /// `watch()` is included in it and one registered after is not (README,
  /// "Hook order"); `record_grads` takes what the optimizer applies
  /// whatever the order.
  ///
  /// Example:
  /// ```
  /// d_loss.backward();
  /// rec->record_grads(d_opt);   // what d_opt applies
  /// d_opt.step();
  /// g_loss.backward();          // reaches D's parameters again: not recorded
  /// ```
  void record_grads(const torch::optim::Optimizer& optimizer);

  /// Names a phase of the loop: while the returned object lives, records of
  /// kinds `activation`, `activation_grad` and `tensor` made on this thread
  /// are named `<name>/<their name>` (scopes nest: `outer/inner/...`). Tells
  /// apart a module run several times in a step, which would otherwise be
  /// `N`, `N#1`, `N#2`.
  ///
  /// Example:
  /// ```
  /// { auto s = rec->scope("real"); d_real = disc->forward(real); }   // "real/0", "real/1", ...
  /// { auto s = rec->scope("fake"); d_fake = disc->forward(fake); }   // "fake/0", ...
  /// ```
  class Scope {
   public:
    Scope(Scope&& other) noexcept : front_(other.front_) { other.front_ = nullptr; }
    Scope(const Scope&) = delete;
    Scope& operator=(const Scope&) = delete;
    Scope& operator=(Scope&&) = delete;
    ~Scope();

   private:
    friend class Recorder;
    explicit Scope(detail::FrontEnd* front) : front_(front) {}
    detail::FrontEnd* front_;
  };
  [[nodiscard]] Scope scope(const std::string& name);

  /// Whether the current step is sampled for `kind`. Lets a caller skip work
  /// that only feeds a capture.
  bool sampled(Kind kind = Kind::Tensor) const;

  /// The step given to the last `step()` call, or -1 before the first.
  std::int64_t current_step() const;

  /// Returns when every record of the steps that have ended, and every
  /// `capture()` so far, is on disk. Rethrows the first writer error.
  void flush();

  /// Ends the last step, writes everything, removes the hooks, and rewrites
  /// run.json with `"closed": true`, the final counts and every dump in
  /// "dumps". Rethrows the first writer error. Calling it again does nothing.
  void close();

  /// Flight recorder (`Options::flight_recorder`): writes the steps it
  /// holds and the current one, as a NaN would, with reason "user": a line
  /// of `dumps.jsonl` when it is made, and an entry of run.json's "dumps"
  /// at `close()`. The dump happens on the writer thread after every
  /// capture made before this call; `flush()` waits for it. Throws `Error`
  /// if the flight recorder is off, before the first `step()` and after
  /// `close()`.
  void dump();

  /// The counters so far.
  Counters counters() const;
  /// The name `counters()` had before 0.2; it goes in the release after.
  [[deprecated("Recorder::stats() is now Recorder::counters()")]] Counters stats() const { return counters(); }

  /// The flight recorder's dumps and the triggers' marks, as of the last
  /// `step()`: a loop can check at the top of each iteration whether a rule
  /// fired (to checkpoint, or lower the learning rate) and see the same
  /// list until the next `step()`. A rule is evaluated on the writer
  /// thread, so it shows up at a `step()` after the step that fired it.
  /// The list is copied when this is called: a step costs the same after
  /// thousands of dumps as before the first.
  std::vector<Dump> dumps() const;

  /// The options the recorder was made with.
  const Options& options() const;

  /// Where this process writes: `options().dir()`, or `<dir>/rank<r>` when
  /// the world size is above 1.
  const std::string& run_dir() const;
  /// This process's rank and the world size, as resolved from the options
  /// and the environment.
  std::int64_t rank() const;
  std::int64_t world_size() const;
  /// False on a rank that `Options::ranks` leaves out: nothing is captured.
  bool capturing() const;

 private:
  // watch() reaches the front end through detail::RecorderAccess.
  friend struct detail::RecorderAccess;
  std::shared_ptr<detail::FrontEnd> front_;
};

}  // namespace tensortap
