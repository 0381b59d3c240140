#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <tensortap/kinds.h>

namespace tensortap {

/// The statistics of one tensor at one step, as `Options::stats_every`
/// computes them: what a `Trigger` looks at. min, max, mean, std
/// (population) and norm (L2) are over the finite values; the counts are of
/// NaN, +Inf, -Inf, zeros and elements.
struct TensorSummary {
  std::int64_t step = 0;
  Kind kind = Kind::Tensor;
  /// The record's name (with its `#k` repeat suffix, if any).
  std::string name;
  double min = 0, max = 0, mean = 0, std = 0, norm = 0;
  std::int64_t nan = 0, posinf = 0, neginf = 0, zeros = 0, numel = 0;
};

/// When the flight recorder dumps (`Options::dump_on`): a rule evaluated on
/// the writer thread from the statistics it already computes, never on the
/// training thread (a CUDA tensor's statistics are computed on its device,
/// so a trigger adds no synchronization). When one fires, the flight
/// recorder writes the steps it holds (without one, the run is only marked:
/// the dump is listed with no steps), a line of `dumps.jsonl` (and, at
/// close, `run.json`'s "dumps") says which rule fired, on which tensor, with
/// what value against what median, and `Options::after_dump` applies.
///
/// A rule fires once per run, unless `cooldown(n)` lets it fire again `n`
/// steps after it last did.
///
/// How rules compose:
/// - Without any `dump_on()`, the flight recorder dumps on `non_finite()`.
///   Rules given to `dump_on()` replace that default: add
///   `Trigger::non_finite()` among them to keep it.
/// - `spike` and `norm_jump` also fire when the tensor they watch holds a
///   NaN or an Inf (reason "nan" or "inf"), whatever their history: a loss
///   that becomes NaN is the largest spike there is. Such a value does not
///   enter their history.
/// - A median of zero (or a subnormal one) has no ratio: after a run of
///   exact zeros, `spike` and `norm_jump` do not fire on a small value.
/// - Each rule is evaluated on every tensor; the first rule that fires on a
///   tensor makes the dump, and each rule keeps its own cooldown.
///
/// Example:
/// ```
/// tensortap::Options("runs/x")
///     .stats_every(1)
///     .flight_recorder(20)
///     .dump_on(tensortap::Trigger::spike("loss", 5.0, 50))
///     .dump_on(tensortap::Trigger::norm_jump(10.0, 20).cooldown(100));
/// ```
class Trigger {
 public:
  enum class Type { NonFinite, Spike, NormJump, When };

  /// A NaN or an Inf in any captured tensor (or its statistics). The
  /// default when no trigger is given.
  static Trigger non_finite();
  /// The tensor `name` (any kind; a scalar such as the loss) whose value,
  /// its statistics' `mean`, is in magnitude more than `factor` times the
  /// median magnitude of its last `window` values. It needs
  /// min(window, 3) earlier values before it can fire; a value equal to
  /// factor x median does not fire.
  static Trigger spike(std::string name, double factor, std::int64_t window);
  /// Any selected tensor whose L2 norm is more than `factor` times the
  /// median of its own last `window` norms (same rule of earlier values).
  static Trigger norm_jump(double factor, std::int64_t window);
  /// Any tensor whose statistics make `predicate` true. A predicate that
  /// throws is an error under `Options::on_error`, and the rule stops. It
  /// runs on tensortap's writer thread: a call back into the recorder that
  /// would wait for that thread (`flush`, `close`, `capture`, `step`,
  /// `dump`, `record_grads`) throws `Error` there instead of deadlocking.
  static Trigger when(std::function<bool(const TensorSummary&)> predicate);

  /// Lets the rule fire again `steps` steps after it last fired (0: once
  /// per run, the default).
  Trigger& cooldown(std::int64_t steps);

  Type type() const { return type_; }
  /// "non_finite", "spike", "norm_jump" or "when".
  const char* type_name() const;
  /// Spike: the tensor's name; empty otherwise.
  const std::string& name() const { return name_; }
  double factor() const { return factor_; }
  std::int64_t window() const { return window_; }
  std::int64_t cooldown() const { return cooldown_; }
  const std::function<bool(const TensorSummary&)>& predicate() const { return predicate_; }

 private:
  explicit Trigger(Type type) : type_(type) {}
  Type type_;
  std::string name_;
  double factor_ = 0;
  std::int64_t window_ = 0;
  std::int64_t cooldown_ = 0;
  std::function<bool(const TensorSummary&)> predicate_;
};

/// A dump the flight recorder made, or a trigger's mark in a run without
/// one (`Recorder::dumps()`, a line of `dumps.jsonl`, and `run.json`'s
/// "dumps" once the run is closed).
struct Dump {
  /// The step at which it fired.
  std::int64_t step = 0;
  /// "non_finite", "spike", "norm_jump", "when"; "user" for
  /// `Recorder::dump()`, "stall" for the stall watchdog
  /// (`Options::stall_after`), "request" for `tensortap ctl RUN dump`. The
  /// last two never apply `Options::after_dump`.
  std::string trigger;
  /// "nan" or "inf" for non_finite, and for a spike or norm_jump that
  /// fired on a non-finite value; otherwise the trigger's type again.
  std::string reason;
  /// The tensor that fired it (not for "user").
  Kind kind = Kind::Tensor;
  std::string name;
  /// The value that fired it (spike: the mean; norm_jump: the norm) and
  /// the median it was compared with; 0 where they do not apply.
  double value = 0, median = 0;
  /// The rule's parameters (spike, norm_jump); 0 otherwise.
  double factor = 0;
  std::int64_t window = 0;
  /// The steps written, ascending; empty for a mark: without a flight
  /// recorder, or after it stopped following an earlier dump.
  std::vector<std::int64_t> steps;
  /// A stall: the last step that began, how long no step() had come when
  /// the watchdog saw it, and the training threads then waiting inside
  /// tensortap ("thread 4242 in flush() for 12.5 s").
  std::int64_t last_step = -1;
  double stalled_seconds = 0;
  std::vector<std::string> waiting;
};

/// The name `Dump` had before 0.2; it goes in the release after.
using DumpRecord [[deprecated("tensortap::DumpRecord is now tensortap::Dump")]] = Dump;

}  // namespace tensortap
