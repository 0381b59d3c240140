#pragma once

#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <torch/arg.h>

#include <tensortap/format.h>
#include <tensortap/kinds.h>
#include <tensortap/trigger.h>

namespace tensortap {

/// What happens when both staging buffers are full.
enum class Overflow {
  /// The capturing thread waits for the writer: nothing is lost.
  Block,
  /// The new record is dropped and counted in `Counters::dropped` and run.json.
  DropNewest,
};

/// What happens after an error that is not the caller's own: a hook that
/// cannot record a tensor, or a write that fails (disk full, I/O error).
enum class OnError {
  /// Count it, report the first on stderr, and go on; `flush()` and
  /// `close()` rethrow the first.
  Continue,
  /// Also stop capturing, and make the next `step()` throw it: training
  /// stops at an iteration boundary, not inside backward.
  Stop,
};

/// What a disk budget (`Options::max_bytes`) does when full-tensor records
/// would pass it. Named after the setting it answers (`on_budget`), as
/// `OnError` answers `on_error`; `Overflow` is named after the condition
/// (staging overflowing) because there the condition is the whole story.
enum class Budget {
  /// Full-tensor records stop; statistics, TensorBoard, the rules and the
  /// lines files go on within a reserve of 5% of the budget, then stop too.
  StopCapture,
  /// The oldest whole steps are given up (their files deleted, after
  /// run.json's "given_up_below" says so) to make room for the newest;
  /// dumped steps stay. The index goes on in segments (index.<n>.jsonl),
  /// deleted with their steps; `Format::Packed`'s segments hold at most
  /// max_bytes/8. Readers hide what was given up (docs/leaving-it-on.md).
  KeepLatest,
};

/// What the flight recorder does once it has dumped (`Options::after_dump`).
enum class AfterDump {
  /// Keep going: hold the next steps in memory again, and dump again at the
  /// next trigger.
  Continue,
  /// Stop full-tensor capture (statistics go on): the steps that led to the
  /// trigger are on disk, and what follows a NaN is rarely worth keeping.
  StopCapture,
  /// Throw `Error` from the next `step()`, naming the step and the reason:
  /// training stops at an iteration boundary.
  Throw,
};

// Before 0.2 the flight recorder's and the distributed settings had a second
// spelling, a nested struct beside Options' own setters. They stay one
// release, deprecated; Options' setters of the same names are the one spelling.
#if defined(__GNUC__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
#endif

/// Deprecated: use `Options::flight_recorder(k)`, `flight_recorder_bytes`,
/// `after_dump` and `dump_on`.
struct [[deprecated("use Options::flight_recorder(k), .flight_recorder_bytes(), .after_dump() and .dump_on()")]]
FlightRecorderOptions {
  FlightRecorderOptions() = default;
  explicit FlightRecorderOptions(std::int64_t steps) : steps_(steps) {}
  TORCH_ARG(std::int64_t, steps) = 0;
  TORCH_ARG(std::size_t, bytes) = std::size_t{256} << 20;
  TORCH_ARG(AfterDump, after_dump) = AfterDump::StopCapture;

 public:  // TORCH_ARG leaves the access private
  FlightRecorderOptions& dump_on(Trigger trigger) {
    triggers_.push_back(std::move(trigger));
    return *this;
  }
  const std::vector<Trigger>& triggers() const { return triggers_; }

 private:
  std::vector<Trigger> triggers_;
};

/// Deprecated: use `Options::rank`, `world_size` and `ranks`.
struct [[deprecated("use Options::rank(), .world_size() and .ranks()")]] DistributedOptions {
  TORCH_ARG(std::optional<std::int64_t>, rank) = std::nullopt;
  TORCH_ARG(std::optional<std::int64_t>, world_size) = std::nullopt;
  TORCH_ARG(std::vector<std::int64_t>, ranks) = {};
};

#if defined(__GNUC__)
#pragma GCC diagnostic pop
#endif

/// Settings of `Options::tensorboard`: what the writer thread writes to
/// TensorBoard's event files besides the statistics.
struct TensorBoardOptions {
  /// Histograms of every selected tensor whose data reaches the writer
  /// thread, at the steps that are multiples of this, binned on the writer
  /// thread; 0 = none. A 0-d `tensor` record (a loss) gets none.
  TORCH_ARG(std::int64_t, histograms_every) = 100;
  /// The statistics written as scalars `<kind>/<name>/<stat>`, by
  /// `TensorSummary`'s field names (min max mean std norm nan posinf neginf
  /// zeros numel), in any order. Unless one of the counts nan, posinf and
  /// neginf is named, their sum is written as `<kind>/<name>/nonfinite`
  /// from the first step where it is not 0 (a chart appears only once
  /// something went wrong). All ten: `.stats({"min", "max", "mean", "std",
  /// "norm", "nan", "posinf", "neginf", "zeros", "numel"})`. `stats.npy`
  /// holds all ten whatever this says. A 0-d `tensor` record is the one
  /// scalar `tensor/<name>`, without statistics tags.
  TORCH_ARG(std::vector<std::string>, stats) = {"mean", "std", "min", "max", "norm"};
};

/// Settings of a `Recorder`: where it writes, what it captures and when.
///
/// A step `s` is sampled when `start <= s`, `s < stop` (if `stop` is set) and
/// `(s - start) % every == 0`. A name is selected when it matches `include`
/// (ECMAScript regex, searched anywhere in the name; empty matches all) and
/// does not match `exclude` (empty matches none).
///
/// Example:
/// ```
/// auto opts = tensortap::Options("runs/exp1")
///                 .every(100)
///                 .include("^fc")
///                 .kinds({tensortap::Kind::Grad, tensortap::Kind::Activation})
///                 .buffer_bytes(32 << 20);
/// ```
struct Options {
  /// `dir` is the run directory; it is created if missing.
  /* implicit */ Options(std::string dir) : dir_(std::move(dir)) {}

  /// The run directory.
  TORCH_ARG(std::string, dir);
  /// The file format.
  TORCH_ARG(Format, format) = Format::Npy;
  /// Capture every `every`-th step, counted from `start`; 0 = never, for
  /// statistics only (`stats_every`).
  TORCH_ARG(std::int64_t, every) = 1;

 public:  // TORCH_ARG leaves the access private
  /// Capture `kind` every `n`-th step instead, e.g. gradients every 10 steps
  /// and activations every 100: `.every(Kind::Grad, 10).every(Kind::Activation, 100)`;
  /// 0 = never for this kind.
  Options& every(Kind kind, std::int64_t n) {
    every_kind_.at(static_cast<std::size_t>(kind)) = n;
    return *this;
  }
  /// The period of `kind`: its own, or `every()`.
  std::int64_t every(Kind kind) const { return every_kind_.at(static_cast<std::size_t>(kind)).value_or(every_); }
  /// The period `every(kind, n)` set for `kind`, if it set one (unset: the
  /// kind follows `every()`).
  std::optional<std::int64_t> every_override(Kind kind) const {
    return every_kind_.at(static_cast<std::size_t>(kind));
  }
  /// The name `every_override` had before 0.2's second pass.
  [[deprecated("use Options::every_override(kind)")]] std::optional<std::int64_t> every_of(Kind kind) const {
    return every_override(kind);
  }
  /// Capture exactly these steps (within `start`/`stop`) instead of every
  /// n-th one; empty = use `every`. A kind switched off with
  /// `every(kind, 0)` stays off at these steps too.
  TORCH_ARG(std::vector<std::int64_t>, steps) = {};
  /// The first step that may be sampled.
  TORCH_ARG(std::int64_t, start) = 0;

  /// The first step that is no longer sampled; unset (the default): never
  /// stop.
  TORCH_ARG(std::optional<std::int64_t>, stop) = std::nullopt;
  /// Names to capture: an ECMAScript regex searched in the name; empty = all.
  TORCH_ARG(std::string, include) = "";
  /// Names to skip: an ECMAScript regex searched in the name; empty = none.
  TORCH_ARG(std::string, exclude) = "";
  /// Which kinds to capture. `Param` and `Buffer` are off by default.
  TORCH_ARG(KindSet, kinds) = KindSet::defaults();
  /// Size of each of the two host staging buffers, in bytes. The training
  /// thread fills one while the writer thread drains the other, so staging
  /// never holds more than twice this. A larger tensor is streamed through in
  /// chunks of this size. On a rank that captures, both buffers are
  /// allocated and faulted in when the recorder starts (on its writer
  /// thread, with huge pages where the system allows), so that no capture
  /// pays page faults: the process holds twice this from then on.
  TORCH_ARG(std::size_t, buffer_bytes) = std::size_t{64} << 20;
  /// What happens when both buffers are full.
  TORCH_ARG(Overflow, overflow) = Overflow::Block;
  /// Whether a run directory that already holds a run may be replaced. Only
  /// the names tensortap writes there are removed: run.json, index.jsonl,
  /// dumps.jsonl, npy/, packed/, tensors.h5 (and the journal an interrupted
  /// HDF5 writer left, .tensors.h5.journal), stats.npy and
  /// stats_series.jsonl, TensorBoard's events.out.tfevents.*.tensortap; in a
  /// multi-rank run, those of each rank<r>/ folder.
  TORCH_ARG(bool, overwrite) = false;
  /// Settings of `Format::Hdf5`.
  TORCH_ARG(Hdf5Options, hdf5) = Hdf5Options();
  /// Settings of `Format::Packed`.
  TORCH_ARG(PackedOptions, packed) = PackedOptions();
  /// What an error in a hook or on the writer thread does to training.
  TORCH_ARG(OnError, on_error) = OnError::Continue;
  /// Whether forward passes of a module in eval mode (`module->eval()`) are
  /// captured too, named `eval/<name>` (as inside `Recorder::scope("eval")`),
  /// so a validation pass inside a sampled step never reads as a second
  /// training pass (`name#1`). Off: eval passes are not recorded.
  TORCH_ARG(bool, capture_eval) = false;
  /// Record each backward pass's parameter gradient on its own (`name`,
  /// `name#1`, ... within a step: one per micro-batch) instead of their sum.
  TORCH_ARG(bool, grad_per_backward) = false;
  /// Make the children of every `torch::nn::Sequential` in the watched tree
  /// whose path matches this regex (searched; "." matches all) tap points,
  /// as `tensortap::tap_sequential()` does. Empty: none.
  TORCH_ARG(std::string, tap_sequential) = "";
  /// Op-level capture: inside a `Tapped<M>` or a tapped Sequential child,
  /// also record the output of every top-level ATen op as kind `activation`,
  /// named `<module path>/<op>` (e.g. `encoder.1/aten::addmm`, then
  /// `#1`...); the ops those ops call are not. For when nothing finer was marked; it costs a callback on
  /// every ATen op in the process while a recorder with it is open.
  TORCH_ARG(bool, capture_ops) = false;
  /// A disk budget: the most bytes this rank's run directory may hold, every
  /// file tensortap writes there counted (its apparent size, `du -sb`); 0
  /// (the default): no budget. What happens when full-tensor records would
  /// pass it: `on_budget`.
  TORCH_ARG(std::size_t, max_bytes) = 0;
  /// The policy of `max_bytes` (see `Budget`). `Format::Hdf5` refuses
  /// `Budget::KeepLatest`: a record's rows cannot be given up in place.
  TORCH_ARG(Budget, on_budget) = Budget::StopCapture;
  /// Under `Budget::KeepLatest`, the percent of `max_bytes` that steps
  /// flight-recorder dumps wrote may keep below the newest steps (0 to
  /// 100): past it the oldest dumped steps are given up first, and a dump
  /// larger than it keeps its newest steps (docs/leaving-it-on.md). The
  /// newest steps and the statistics have the rest.
  TORCH_ARG(int, dumps_percent) = 50;
  /// A stall watchdog: when no `step()` comes for this long while the
  /// recorder is open (counted from the first `step()`), the writer thread
  /// dumps the flight recorder (or marks the run) with reason "stall",
  /// once per stall; 0 (the default): off. Set it above the longest phase
  /// without `step()` (an evaluation, a checkpoint): those count too.
  /// `std::chrono::seconds(600)` converts.
  TORCH_ARG(std::chrono::milliseconds, stall_after) = std::chrono::milliseconds(0);
  /// Take statistics (min, max, mean, std, L2 norm, counts of NaN, +Inf,
  /// -Inf and zeros, element count) of every selected tensor every this many
  /// steps, counted from `start`, whatever `every()` says about full
  /// tensors. They go to `stats.npy`, a table of one row per tensor and
  /// step. 0 = off.
  TORCH_ARG(std::int64_t, stats_every) = 0;

 public:
  /// Live statistics in TensorBoard: the writer thread appends TensorBoard
  /// event files (`events.out.tfevents.*.tensortap`) to the run directory
  /// (a rank's own folder), so `tensorboard --logdir runs/` shows the run as
  /// it trains: a scalar per statistic (`<kind>/<name>/<stat>`, at the
  /// `stats_every` steps), every 0-d `tensor` record as `tensor/<name>`,
  /// histograms (`TensorBoardOptions::histograms_every`) and flight-recorder
  /// dumps as text. Written after each batch of the writer thread and by
  /// `flush()`; the training thread does nothing more for it.
  Options& tensorboard(bool on) {
    tensorboard_ = on ? std::optional<TensorBoardOptions>(TensorBoardOptions()) : std::nullopt;
    return *this;
  }
  /// TensorBoard event files with these settings (see `tensorboard(bool)`).
  Options& tensorboard(const TensorBoardOptions& settings) {
    tensorboard_ = settings;
    return *this;
  }
  /// The TensorBoard settings; unset (the default): no event files.
  const std::optional<TensorBoardOptions>& tensorboard() const noexcept { return tensorboard_; }

 private:
  std::optional<TensorBoardOptions> tensorboard_;

 public:
  /// Flight recorder: hold the full tensors of the last `k` sampled steps in
  /// host memory instead of writing them, and write them (with the current
  /// step) only when a rule given to `dump_on()` fires (a NaN or an Inf in
  /// a captured tensor, without any) or when `Recorder::dump()` is called.
  /// 0 = off: sampled steps are written; `after_dump` and `dump_on` still
  /// apply to triggers.
  ///
  /// Example:
  /// ```
  /// auto opts = tensortap::Options("runs/x").stats_every(1)
  ///                 .flight_recorder(20)
  ///                 .flight_recorder_bytes(std::size_t{1} << 30)
  ///                 .after_dump(tensortap::AfterDump::Continue)
  ///                 .dump_on(tensortap::Trigger::spike("loss", 5.0, 50));
  /// ```
  TORCH_ARG(std::int64_t, flight_recorder) = 0;
  /// The most host memory the flight recorder holds; the oldest held steps
  /// are let go first when a step would exceed it.
  TORCH_ARG(std::size_t, flight_recorder_bytes) = std::size_t{256} << 20;
  /// What happens after a dump. Without held steps a trigger only marks the
  /// run, and only `AfterDump::Throw` applies.
  TORCH_ARG(AfterDump, after_dump) = AfterDump::StopCapture;

 public:
  /// Dumps the flight recorder (or, with no steps held, marks the run in
  /// dumps.jsonl) when `trigger` fires; give it several times for several
  /// rules. Without any, a NaN or an Inf dumps (`Trigger::non_finite()`).
  /// Rules other than non_finite need `stats_every`.
  Options& dump_on(Trigger trigger) {
    triggers_.push_back(std::move(trigger));
    return *this;
  }
  /// The rules given to `dump_on(trigger)`, read back under the same name.
  const std::vector<Trigger>& dump_on() const noexcept { return triggers_; }
  /// The name `dump_on()` was read back by before 0.2's second pass.
  [[deprecated("use Options::dump_on() (no argument) to read the rules back")]]
  const std::vector<Trigger>& triggers() const noexcept { return triggers_; }

  /// This process's rank in a distributed run; unset (the default) reads
  /// `RANK` (or `LOCAL_RANK`) from the environment torch.distributed's
  /// launchers set, or 0 if neither is set.
  TORCH_ARG(std::optional<std::int64_t>, rank) = std::nullopt;
  /// How many processes the run has; unset reads `WORLD_SIZE`, or 1. Above
  /// 1, rank r writes `<dir>/rank<r>/`.
  TORCH_ARG(std::optional<std::int64_t>, world_size) = std::nullopt;
  /// Capture only on these ranks (e.g. `{0}`); empty captures on all. The
  /// others create and capture nothing.
  TORCH_ARG(std::vector<std::int64_t>, ranks) = {};

 public:
#if defined(__GNUC__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
#endif
  /// Deprecated (0.1's nested spelling): sets `flight_recorder`,
  /// `flight_recorder_bytes`, `after_dump` and the `dump_on` rules at once.
  [[deprecated("use .flight_recorder(k).flight_recorder_bytes(b).after_dump(a).dump_on(t)")]]
  Options& flight_recorder(const FlightRecorderOptions& f) {
    flight_recorder_ = f.steps();
    flight_recorder_bytes_ = f.bytes();
    after_dump_ = f.after_dump();
    triggers_ = f.triggers();
    return *this;
  }
  /// Deprecated (0.1's nested spelling): sets `rank`, `world_size` and `ranks` at once.
  [[deprecated("use .rank(r).world_size(n).ranks({...})")]]
  Options& distributed(const DistributedOptions& d) {
    rank_ = d.rank();
    world_size_ = d.world_size();
    ranks_ = d.ranks();
    return *this;
  }
  /// Deprecated (0.1's nested spelling): the flight recorder's settings as one struct.
  [[deprecated("use .flight_recorder(), .flight_recorder_bytes(), .after_dump() and .dump_on()")]]
  FlightRecorderOptions flight_recorder_options() const {
    FlightRecorderOptions f(flight_recorder_);
    f.bytes(flight_recorder_bytes_).after_dump(after_dump_);
    for (const Trigger& t : triggers_) f.dump_on(t);
    return f;
  }
  /// Deprecated (0.1's nested spelling): rank, world size and ranks as one struct.
  [[deprecated("use .rank(), .world_size() and .ranks()")]]
  DistributedOptions distributed() const {
    return DistributedOptions().rank(rank_).world_size(world_size_).ranks(ranks_);
  }
#if defined(__GNUC__)
#pragma GCC diagnostic pop
#endif

 private:
  // Per-kind periods set by every(Kind, n); unset = use every().
  std::array<std::optional<std::int64_t>, kKindCount> every_kind_{};
  std::vector<Trigger> triggers_;
};

}  // namespace tensortap
