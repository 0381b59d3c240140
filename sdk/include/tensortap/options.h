#pragma once

#include <array>
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
  /// The new record is dropped and counted in `Stats::dropped` and run.json.
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

/// Settings of the flight recorder (`Options::flight_recorder`): hold the
/// full tensors of the last `steps` sampled steps in host memory instead of
/// writing them, and write them (with the current step) only when a rule
/// given to `dump_on()` fires (a NaN or an Inf in a captured tensor, without
/// any) or when `Recorder::dump()` is called.
///
/// Example:
/// ```
/// auto opts = tensortap::Options("runs/x").stats_every(1).flight_recorder(
///     tensortap::FlightRecorderOptions(20)
///         .bytes(std::size_t{1} << 30)
///         .after_dump(tensortap::AfterDump::Continue)
///         .dump_on(tensortap::Trigger::spike("loss", 5.0, 50)));
/// ```
struct FlightRecorderOptions {
  /// Off: sampled steps are written; `after_dump` and `dump_on` still apply
  /// to triggers.
  FlightRecorderOptions() = default;
  /// Holds the last `steps` sampled steps.
  explicit FlightRecorderOptions(std::int64_t steps) : steps_(steps) {}

  /// How many sampled steps are held in memory; 0 = off: sampled steps are written.
  TORCH_ARG(std::int64_t, steps) = 0;
  /// The most host memory held; the oldest held steps are let go first when a step would exceed it.
  TORCH_ARG(std::size_t, bytes) = std::size_t{256} << 20;
  /// What happens after a dump. Without held steps a trigger only marks the run, and only `Throw` applies.
  TORCH_ARG(AfterDump, after_dump) = AfterDump::StopCapture;

 public:  // TORCH_ARG leaves the access private
  /// Dumps (or, with no steps held, marks the run in dumps.jsonl) when
  /// `trigger` fires; give it several times for several rules. Without
  /// any, a NaN or an Inf dumps (`Trigger::non_finite()`). Rules other than
  /// non_finite need `Options::stats_every`.
  FlightRecorderOptions& dump_on(Trigger trigger) {
    triggers_.push_back(std::move(trigger));
    return *this;
  }
  /// The rules given to `dump_on()`.
  const std::vector<Trigger>& triggers() const { return triggers_; }

 private:
  std::vector<Trigger> triggers_;
};

/// Where this process stands in a distributed run (`Options::distributed`).
/// Unset values are read from the environment torch.distributed's
/// launchers set.
///
/// Example:
/// ```
/// auto opts = tensortap::Options("runs/ddp").distributed(
///     tensortap::DistributedOptions().rank(rank).world_size(world).ranks({0}));
/// ```
struct DistributedOptions {
  /// This process's rank; unset reads `RANK` (or `LOCAL_RANK`) from the environment, or 0 if neither is set.
  TORCH_ARG(std::optional<std::int64_t>, rank) = std::nullopt;
  /// How many processes the run has; unset reads `WORLD_SIZE`, or 1. Above 1, rank r writes `<dir>/rank<r>/`.
  TORCH_ARG(std::optional<std::int64_t>, world_size) = std::nullopt;
  /// Capture only on these ranks (e.g. `{0}`); empty captures on all. Others create and capture nothing.
  TORCH_ARG(std::vector<std::int64_t>, ranks) = {};
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
  /// The period `every(kind, n)` set for `kind`, if it set one.
  std::optional<std::int64_t> every_of(Kind kind) const { return every_kind_.at(static_cast<std::size_t>(kind)); }
  /// Capture exactly these steps (within `start`/`stop`) instead of every
  /// n-th one; empty = use `every`. A kind switched off with
  /// `every(kind, 0)` stays off at these steps too.
  TORCH_ARG(std::vector<std::int64_t>, steps) = {};
  /// The first step that may be sampled.
  TORCH_ARG(std::int64_t, start) = 0;

 public:
  /// The first step that is no longer sampled; unset (the default) = never
  /// stop. A negative step, the old way to say never, still means unset
  /// (deprecated: leave it unset, or pass `std::nullopt`).
  Options& stop(std::optional<std::int64_t> step) {
    stop_ = unset_if_negative(step);
    return *this;
  }
  /// The first step that is no longer sampled, if any.
  const std::optional<std::int64_t>& stop() const noexcept { return stop_; }

  /// Names to capture: an ECMAScript regex searched in the name; empty = all.
  TORCH_ARG(std::string, include) = "";
  /// Names to skip: an ECMAScript regex searched in the name; empty = none.
  TORCH_ARG(std::string, exclude) = "";
  /// Which kinds to capture. `Param` and `Buffer` are off by default.
  TORCH_ARG(KindSet, kinds) = KindSet();
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
  /// what tensortap writes (run.json, index.jsonl, dumps.jsonl, npy/, packed/, tensors.h5, stats.npy,
  /// stats_series.jsonl) is removed.
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
  /// Take statistics (min, max, mean, std, L2 norm, counts of NaN, +Inf,
  /// -Inf and zeros, element count) of every selected tensor every this many
  /// steps, counted from `start`, whatever `every()` says about full
  /// tensors. They go to `stats.npy`, a table of one row per tensor and
  /// step. 0 = off.
  TORCH_ARG(std::int64_t, stats_every) = 0;
  /// Where this process stands in a distributed run; `rank()`,
  /// `world_size()` and `ranks()` below are its fields.
  TORCH_ARG(DistributedOptions, distributed) = DistributedOptions();

 public:
  /// Flight recorder: hold the full tensors of the last `k` sampled steps in
  /// host memory instead of writing them (`FlightRecorderOptions::steps`).
  /// 0 = off: sampled steps are written.
  Options& flight_recorder(std::int64_t k) {
    flight_recorder_.steps(k);
    return *this;
  }
  /// All the flight recorder's settings at once; this replaces those given
  /// before, `dump_on()` rules included.
  Options& flight_recorder(FlightRecorderOptions options) {
    flight_recorder_ = std::move(options);
    return *this;
  }
  /// How many sampled steps the flight recorder holds; 0 = off.
  const std::int64_t& flight_recorder() const noexcept { return flight_recorder_.steps(); }
  std::int64_t& flight_recorder() noexcept { return flight_recorder_.steps(); }
  /// The flight recorder's settings.
  const FlightRecorderOptions& flight_recorder_options() const noexcept { return flight_recorder_; }

  /// The most host memory the flight recorder holds (`FlightRecorderOptions::bytes`).
  Options& flight_recorder_bytes(std::size_t bytes) {
    flight_recorder_.bytes(bytes);
    return *this;
  }
  const std::size_t& flight_recorder_bytes() const noexcept { return flight_recorder_.bytes(); }
  std::size_t& flight_recorder_bytes() noexcept { return flight_recorder_.bytes(); }

  /// What happens after the flight recorder dumped (`FlightRecorderOptions::after_dump`).
  Options& after_dump(AfterDump what) {
    flight_recorder_.after_dump(what);
    return *this;
  }
  const AfterDump& after_dump() const noexcept { return flight_recorder_.after_dump(); }
  AfterDump& after_dump() noexcept { return flight_recorder_.after_dump(); }

  /// Dumps the flight recorder (or, without one, marks the run) when
  /// `trigger` fires (`FlightRecorderOptions::dump_on`).
  Options& dump_on(Trigger trigger) {
    flight_recorder_.dump_on(std::move(trigger));
    return *this;
  }
  /// The rules given to `dump_on()`.
  const std::vector<Trigger>& triggers() const noexcept { return flight_recorder_.triggers(); }

  /// This process's rank (`DistributedOptions::rank`). A negative rank, the
  /// old way to leave it unset, still means unset (deprecated: leave it
  /// unset, or pass `std::nullopt`).
  Options& rank(std::optional<std::int64_t> rank) {
    distributed_.rank(unset_if_negative(rank));
    return *this;
  }
  const std::optional<std::int64_t>& rank() const noexcept { return distributed_.rank(); }

  /// How many processes the run has (`DistributedOptions::world_size`). A
  /// negative size, the old way to leave it unset, still means unset
  /// (deprecated).
  Options& world_size(std::optional<std::int64_t> size) {
    distributed_.world_size(unset_if_negative(size));
    return *this;
  }
  const std::optional<std::int64_t>& world_size() const noexcept { return distributed_.world_size(); }

  /// Capture only on these ranks (`DistributedOptions::ranks`); empty captures on all.
  Options& ranks(std::vector<std::int64_t> ranks) {
    distributed_.ranks(std::move(ranks));
    return *this;
  }
  const std::vector<std::int64_t>& ranks() const noexcept { return distributed_.ranks(); }
  std::vector<std::int64_t>& ranks() noexcept { return distributed_.ranks(); }

 private:
  // Before std::optional, -1 (any negative) stood for "unset"; code that
  // still passes it keeps its meaning.
  static std::optional<std::int64_t> unset_if_negative(std::optional<std::int64_t> v) {
    return v && *v < 0 ? std::nullopt : v;
  }

  std::optional<std::int64_t> stop_;
  // Per-kind periods set by every(Kind, n); unset = use every().
  std::array<std::optional<std::int64_t>, kKindCount> every_kind_{};
  FlightRecorderOptions flight_recorder_;
};

}  // namespace tensortap
