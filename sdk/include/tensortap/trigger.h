#pragma once

#include <cstdint>
#include <functional>
#include <limits>
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
///   tensor makes the dump, and each rule keeps its own cooldown. A health
///   rule that fires makes a dump of its own, whatever else fired on the
///   row: its firing is where an episode opens, which never comes again.
/// - The health rules judge statistics rows only: they need
///   `Options::stats_every`, and see the steps it samples.
///
/// Example:
/// ```
/// tensortap::Options("runs/x")
///     .stats_every(1)
///     .flight_recorder(20)
///     .dump_on(tensortap::Trigger::spike("loss", 5.0, 50))
///     .dump_on(tensortap::Trigger::norm_jump(10.0, 20).cooldown(100));
/// ```
///
/// The training health rules (docs/health.md; their definition is the
/// docstring of python/tensortap/_doctor.py, which `tensortap doctor`
/// evaluates offline) are triggers too: `vanishing_gradient()` and the
/// rest, with the doctor's defaults, and a chained setter per parameter
/// named as its `--set <rule>.<parameter>` (`dead_relu().threshold(0.9)`).
/// A rule fires where the doctor's episode opens, at its `patience`-th
/// evaluation, and each rule that fires on a row makes its own dump (reason
/// and `Dump::trigger` the rule's name, `Dump::threshold` the bound). Under
/// the default `AfterDump::StopCapture` the first firing stops the flight
/// recorder; later dumps are then marks. `weight_update_ratio` needs two
/// full records of a parameter, which the writer does not keep: it is
/// refused live (evaluate it with `tensortap doctor`).
///
/// ```
/// tensortap::Options("runs/x")
///     .stats_every(1)
///     .dump_on(tensortap::Trigger::vanishing_gradient())
///     .dump_on(tensortap::Trigger::dead_relu().threshold(0.9).patience(5));
/// ```
class Trigger {
 public:
  enum class Type {
    NonFinite,
    Spike,
    NormJump,
    When,
    // The training health rules.
    VanishingGradient,
    ExplodingTensor,
    AllZero,
    UnchangedTensor,
    LossNotDecreasing,
    DeadRelu,
    SaturatedActivation,
    TensorVariance,
    PoorWeightInitialization,
    WeightUpdateRatio,
  };

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

  /// Training health rules, each with its defaults (docs/health.md).
  /// A gradient whose RMS (norm / sqrt(numel)) is below `threshold`:
  /// kinds grad, include "weight", threshold 1e-7, patience 3.
  static Trigger vanishing_gradient();
  /// A NaN or an Inf (or, with `bound` > 0, max(|min|, |max|) > bound):
  /// every kind, include "", bound 0. Fires at the first exploding row of a
  /// blow-up (steps in a row where some tensor explodes, a gap of one
  /// bridged), naming it.
  static Trigger exploding_tensor();
  /// Every element zero: kinds activation, activation_grad, param and grad,
  /// include "", patience 2; a parameter's first row is exempt.
  static Trigger all_zero();
  /// A parameter's statistics unchanged while its gradient is not zero:
  /// include "weight", num_steps 3.
  static Trigger unchanged_tensor();
  /// The mean of the 0-d tensor `name` over whole windows of `window`
  /// values no longer falling: window 20, min_decrease 0.001, min_progress
  /// 0.05.
  static Trigger loss_not_decreasing(std::string name = "loss");
  /// The fraction of zeros of a ReLU's output (an activation whose name
  /// `include` finds, not a `<name>_input`) above `threshold`: include
  /// "relu", threshold 0.95, patience 3.
  static Trigger dead_relu();
  /// A lower bound, from the statistics, of the fraction of a tanh's or a
  /// sigmoid's elements whose derivative is below `derivative` times its
  /// peak, above `threshold`: include "tanh|sigmoid", derivative 0.1,
  /// threshold 0.5, patience 3.
  static Trigger saturated_activation();
  /// A std more than `factor` times above or below the median of the
  /// tensor's last `window` stds: kinds activation, activation_grad, param
  /// and grad, include "", factor 100, window 50.
  static Trigger tensor_variance();
  /// At the first step, the largest std of the nonlinearities' inputs over
  /// the smallest above `threshold`: include "(relu|tanh|sigmoid).*_input",
  /// threshold 10. Judged once that step's rows are complete (a row of a
  /// later statistics step among those it selects: a run with a single
  /// statistics step is not judged live); the dump names the input with
  /// the largest std, at the first step.
  static Trigger poor_weight_initialization();
  /// Offline only (`tensortap doctor`): Options refuse it. Its parameters
  /// (include "weight", large 0.1, small 1e-8, patience 1) exist so that a
  /// rule's settings are written once for both.
  static Trigger weight_update_ratio();

  /// Lets the rule fire again `steps` steps after it last fired (0: once
  /// per run, the default).
  Trigger& cooldown(std::int64_t steps);

  /// The health rules' parameters, as `tensortap doctor --set
  /// <rule>.<parameter>=<value>`. A setter the rule has no such parameter
  /// for (or spike's and norm_jump's own, factor, window and name, on
  /// another rule) is refused by Options, naming the rule and the
  /// parameter.
  /// Which kinds it judges (not empty).
  Trigger& kinds(KindSet kinds);
  /// A regular expression (the ECMAScript subset `Options::include` takes)
  /// searched in the name, ASCII letters without regard to case; "" finds
  /// every name.
  Trigger& include(std::string pattern);
  Trigger& threshold(double threshold);
  /// Evaluations in a row (at least 1) before an episode opens.
  Trigger& patience(std::int64_t evaluations);
  Trigger& bound(double bound);
  Trigger& num_steps(std::int64_t steps);
  Trigger& window(std::int64_t window);
  Trigger& factor(double factor);
  Trigger& name(std::string name);
  Trigger& min_decrease(double fraction);
  Trigger& min_progress(double fraction);
  Trigger& derivative(double fraction);
  Trigger& large(double ratio);
  Trigger& small(double ratio);

  Type type() const { return type_; }
  /// "non_finite", "spike", "norm_jump", "when", or a health rule's name
  /// ("vanishing_gradient", ...).
  const char* type_name() const;
  /// Whether it is a training health rule.
  bool is_health_rule() const { return type_ >= Type::VanishingGradient; }
  /// Spike, loss_not_decreasing: the tensor's name; empty otherwise.
  const std::string& name() const { return name_; }
  double factor() const { return factor_; }
  std::int64_t window() const { return window_; }
  std::int64_t cooldown() const { return cooldown_; }
  const std::function<bool(const TensorSummary&)>& predicate() const { return predicate_; }
  KindSet kinds() const { return kinds_; }
  const std::string& include() const { return include_; }
  double threshold() const { return threshold_; }
  std::int64_t patience() const { return patience_; }
  double bound() const { return bound_; }
  std::int64_t num_steps() const { return num_steps_; }
  double min_decrease() const { return min_decrease_; }
  double min_progress() const { return min_progress_; }
  double derivative() const { return derivative_; }
  double large() const { return large_; }
  double small() const { return small_; }
  /// The first parameter set that the rule does not have ("" if none):
  /// what Options refuse.
  const std::string& foreign_parameter() const { return foreign_; }

 private:
  explicit Trigger(Type type) : type_(type) {}
  // Notes a setter of `parameter`: Options refuse one the rule lacks.
  void set(const char* parameter);
  Type type_;
  std::string name_;
  double factor_ = 0;
  std::int64_t window_ = 0;
  std::int64_t cooldown_ = 0;
  std::function<bool(const TensorSummary&)> predicate_;
  KindSet kinds_ = KindSet::none();
  std::string include_;
  double threshold_ = 0, bound_ = 0, min_decrease_ = 0, min_progress_ = 0, derivative_ = 0, large_ = 0, small_ = 0;
  std::int64_t patience_ = 0, num_steps_ = 0;
  std::string foreign_;
};

/// A dump the flight recorder made, or a trigger's mark in a run without
/// one (`Recorder::dumps()`, a line of `dumps.jsonl`, and `run.json`'s
/// "dumps" once the run is closed).
struct Dump {
  /// The step at which it fired.
  std::int64_t step = 0;
  /// "non_finite", "spike", "norm_jump", "when", a health rule's name;
  /// "user" for
  /// `Recorder::dump()`, "stall" for the stall watchdog
  /// (`Options::stall_after`), "request" for `tensortap ctl RUN dump`. The
  /// last two never apply `Options::after_dump`.
  std::string trigger;
  /// "nan" or "inf" for non_finite, and for a spike or norm_jump that
  /// fired on a non-finite value; otherwise the trigger's type again (a
  /// health rule's name, exploding_tensor's too).
  std::string reason;
  /// The tensor that fired it (not for "user").
  Kind kind = Kind::Tensor;
  std::string name;
  /// The value that fired it (spike: the mean; norm_jump: the norm; a
  /// health rule: its measure, docs/health.md) and the median it was
  /// compared with; 0 where they do not apply.
  double value = 0, median = 0;
  /// A health rule's: the bound `value` crossed (the rule's threshold, or
  /// 1 / factor for a tensor_variance whose std fell). NaN for the other
  /// dumps, which have none (dumps.jsonl then has no "threshold").
  double threshold = std::numeric_limits<double>::quiet_NaN();
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
  /// Held steps the dump could not keep, ascending, and why: the disk
  /// budget refused their records, or (Budget::KeepLatest) the dumps'
  /// share of it kept newer steps. `steps` lists only steps written.
  std::vector<std::int64_t> refused_steps;
  std::string refused_reason;
};

/// The name `Dump` had before 0.2; it goes in the release after.
using DumpRecord [[deprecated("tensortap::DumpRecord is now tensortap::Dump")]] = Dump;

}  // namespace tensortap
