#include "sdk/src/flight/triggers.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include <fmt/format.h>

#include <tensortap/error.h>
#include "sdk/src/flight/health.h"
#include "sdk/src/sinks/trigger_params.h"
#include "writers/src/kind_set_access.h"
#include "writers/src/check.h"

namespace tensortap {
namespace detail {
namespace {

// How a rule is named in messages: spike("loss", 5, 50).
std::string describe(const Trigger& t) {
  switch (t.type()) {
    case Trigger::Type::Spike: return fmt::format("Trigger::spike(\"{}\", {}, {})", t.name(), t.factor(), t.window());
    case Trigger::Type::NormJump: return fmt::format("Trigger::norm_jump({}, {})", t.factor(), t.window());
    case Trigger::Type::When: return "Trigger::when(...)";
    case Trigger::Type::NonFinite: return "Trigger::non_finite()";
    case Trigger::Type::LossNotDecreasing: return fmt::format("Trigger::loss_not_decreasing(\"{}\")", t.name());
    default: break;
  }
  return fmt::format("Trigger::{}()", t.type_name());
}

}  // namespace

// A health rule's parameters, in the doctor's ranges (its _TYPES).
void validate_health_rule(const Trigger& t, const std::string& what) {
  if (t.type() == Trigger::Type::WeightUpdateRatio)
    fail(
        "Options::dump_on({}): weight_update_ratio is evaluated offline only (tensortap doctor): it needs the "
        "values of a parameter at two recorded steps, ||w_s' - w_s||, which the writer thread does not keep",
        what);
  const std::uint32_t has = trigger_params(t.type());
  const auto bad = [&](const char* param, const std::string& value, const char* wants) {
    fail("Options::dump_on({}): {} {} is not {}", what, param, value, wants);
  };
  constexpr std::int64_t kMaxCount = std::int64_t{1} << 62;
  if ((has & kParamKinds) && KindSetAccess::bits(t.kinds()) == 0) bad("kinds", "(none)", "a non-empty set of kinds");
  // The automaton the rule runs (core/pattern.h): it refuses what it
  // cannot run, naming the pattern and the place.
  if (has & kParamInclude) {
    try {
      Pattern(t.include(), "include", /*ignore_case=*/true);
    } catch (const std::exception& e) {
      fail("Options::dump_on({}): include '{}' is not a regular expression tensortap runs: {}", what, t.include(),
           e.what());
    }
  }
  if ((has & kParamName) && t.name().empty()) bad("name", "''", "a tensor's name");
  const auto count = [&](TriggerParam p, std::int64_t v, std::int64_t least) {
    if ((has & p) && (v < least || v > kMaxCount))
      bad(trigger_param_name(p), std::to_string(v), least == 1 ? "an integer >= 1 (at most 2**62)"
                                                               : "an integer >= 2 (at most 2**62)");
  };
  count(kParamPatience, t.patience(), 1);
  count(kParamWindow, t.window(), 1);
  count(kParamNumSteps, t.num_steps(), 2);
  const auto fraction = [&](TriggerParam p, double v) {
    if ((has & p) && !(v > 0 && v < 1)) bad(trigger_param_name(p), fmt::format("{}", v), "a number between 0 and 1 (exclusive)");
  };
  fraction(kParamMinDecrease, t.min_decrease());
  fraction(kParamMinProgress, t.min_progress());
  fraction(kParamDerivative, t.derivative());
  if ((has & kParamBound) && !(t.bound() >= 0 && std::isfinite(t.bound())))
    bad("bound", fmt::format("{}", t.bound()), "a number >= 0 (0: off)");
  if ((has & kParamFactor) && !(t.factor() > 1 && std::isfinite(t.factor())))
    bad("factor", fmt::format("{}", t.factor()), "a number > 1");
  if (has & kParamThreshold) {
    const double v = t.threshold();
    switch (t.type()) {
      case Trigger::Type::DeadRelu:
      case Trigger::Type::SaturatedActivation: fraction(kParamThreshold, v); break;
      case Trigger::Type::PoorWeightInitialization:
        if (!(v > 1 && std::isfinite(v))) bad("threshold", fmt::format("{}", v), "a number > 1");
        break;
      default:
        if (!(v > 0 && std::isfinite(v))) bad("threshold", fmt::format("{}", v), "a number > 0");
    }
  }
}

void validate_triggers(const Options& o) {
  for (const Trigger& t : o.dump_on()) {
    const std::string what = describe(t);
    if (t.cooldown() < 0)
      fail(
          "Options::dump_on({}.cooldown({})): the cooldown must be 0 (once per run) or "
          "more steps",
          what, t.cooldown());
    if (t.type() == Trigger::Type::Spike || t.type() == Trigger::Type::NormJump) {
      // Their factor and window are the factory's arguments, not setters.
      if (!(t.factor() > 1.0) || !std::isfinite(t.factor()))
        fail("Options::dump_on({}): the factor must be a finite number above 1", what);
      if (t.window() < 1) fail("Options::dump_on({}): the window must be at least 1 step", what);
    }
    if (t.type() == Trigger::Type::Spike && t.name().empty())
      fail("Options::dump_on({}): spike needs the name of a tensor", what);
    if (t.type() == Trigger::Type::When && !t.predicate())
      fail("Options::dump_on(Trigger::when(...)): the predicate is empty");
    if (!t.foreign_parameter().empty())
      fail("Options::dump_on({}.{}(...)): {} has no parameter {} (docs/health.md lists each rule's)", what,
           t.foreign_parameter(), t.type_name(), t.foreign_parameter());
    if (t.is_health_rule()) validate_health_rule(t, what);
    // Every rule looks at statistics; non_finite also at what the flight
    // recorder holds.
    if (o.stats_every() <= 0 && !(t.type() == Trigger::Type::NonFinite && o.flight_recorder() > 0))
      fail(
          "Options::dump_on({}) needs the statistics of the tensors it watches, and "
          "Options::stats_every is 0: set stats_every(1) (or every n-th step)",
          what);
  }
}

namespace {

// A Trigger::when's predicate asked of `s`; nullopt when it threw, which
// stops its rule (`error` says so): a user's function must not fail the
// writer thread.
std::optional<bool> ask_predicate(const Trigger& t, const TensorSummary& s, std::string& error) {
  try {
    return t.predicate()(s);
  } catch (const std::exception& e) {
    error = fmt::format(
        "tensortap: the predicate of Trigger::when threw on {} '{}' at step {}: {}; the rule is "
        "off from now on",
        kind_name(s.kind), s.name, s.step, e.what());
  } catch (...) {
    error = fmt::format(
        "tensortap: the predicate of Trigger::when threw on {} '{}' at step {}; the rule is off "
        "from now on",
        kind_name(s.kind), s.name, s.step);
  }
  return std::nullopt;
}

// The dump record of rule `t` firing on `s`: a NaN or an Inf is the reason
// for any rule but a predicate's, which says only that it fired.
Dump dump_of(const Trigger& t, const TensorSummary& s, bool non_finite, double value, double median) {
  Dump d;
  d.step = s.step;
  d.trigger = t.type_name();
  d.reason = t.type() == Trigger::Type::NonFinite || (non_finite && t.type() != Trigger::Type::When)
                 ? (s.nan > 0 ? "nan" : "inf")
                 : t.type_name();
  d.kind = s.kind;
  d.name = s.name;
  d.value = value;
  d.median = median;
  d.factor = t.factor();
  d.window = t.window();
  return d;
}

}  // namespace

Triggers::Triggers(const Options& options) {
  for (const Trigger& t : options.dump_on()) {
    rules_.push_back({t, {}, -1, false, false, nullptr});
    if (t.is_health_rule()) rules_.back().health = std::make_unique<HealthRule>(t, taps_);
  }
  if (rules_.empty() && options.flight_recorder() > 0)
    rules_.push_back({Trigger::non_finite(), {}, -1, false, false, nullptr});
  for (const Rule& r : rules_) non_finite_ = non_finite_ || r.trigger.type() == Trigger::Type::NonFinite;
}

bool Triggers::jumps(Rule& rule, const std::string& key, double value, double& median) {
  std::deque<double>& h = rule.history[key];
  bool fires = false;
  const std::size_t needed = static_cast<std::size_t>(std::min<std::int64_t>(rule.trigger.window(), 3));
  if (std::isfinite(value) && h.size() >= needed) {
    median = median_of(std::vector<double>(h.begin(), h.end()));
    // A ratio to a median of zero (a run of exact zeros) or of a subnormal
    // means nothing: 2e-30 after zeros is no jump. Such a median never fires.
    fires = median >= std::numeric_limits<double>::min() && std::fabs(value) > rule.trigger.factor() * median;
  }
  // Magnitudes: a loss or a norm is compared by size, whatever its sign.
  if (std::isfinite(value)) {
    h.push_back(std::fabs(value));
    if (static_cast<std::int64_t>(h.size()) > rule.trigger.window()) h.pop_front();
  }
  return fires;
}

Triggers::~Triggers() = default;

std::vector<Dump> Triggers::evaluate(const TensorSummary& s, bool only_non_finite, std::string& error) {
  std::vector<Dump> fired;
  std::optional<Dump> first;
  std::string key;
  // A tensor holding a NaN or an Inf has no finite value to compare: to a
  // spike or a norm jump that is the largest jump there is, so those fire on
  // it too (whatever their history), and it stays out of their history.
  const bool non_finite = s.nan > 0 || s.posinf > 0 || s.neginf > 0;
  const double non_finite_value =
      s.nan > 0 ? std::numeric_limits<double>::quiet_NaN() : std::numeric_limits<double>::infinity();
  for (Rule& rule : rules_) {
    if (rule.stopped) continue;
    const Trigger& t = rule.trigger;
    if (only_non_finite && t.type() != Trigger::Type::NonFinite) continue;
    if (rule.health) {
      // A health rule's firing opens an episode, which never comes again:
      // it makes a dump of its own, whatever else fired on this row.
      if (key.empty()) {
        key.assign(1, static_cast<char>(s.kind));
        key += s.name;
      }
      std::optional<Dump> d = rule.health->evaluate(s, key);
      if (!d || (rule.fired && (t.cooldown() == 0 || s.step - rule.last_fired < t.cooldown()))) continue;
      rule.fired = true;
      rule.last_fired = s.step;
      fired.push_back(std::move(*d));
      continue;
    }
    bool fires = false;
    double value = 0, median = 0;
    switch (t.type()) {
      case Trigger::Type::NonFinite: fires = s.nan > 0 || s.posinf > 0 || s.neginf > 0; break;
      case Trigger::Type::Spike:
      case Trigger::Type::NormJump:
        if (t.type() == Trigger::Type::Spike && s.name != t.name()) continue;
        // A history per kind and name: a Tap named "loss" has an activation
        // and an activation gradient, two series that one median mixed.
        if (key.empty()) {
          key.assign(1, static_cast<char>(s.kind));
          key += s.name;
        }
        value = non_finite ? non_finite_value : t.type() == Trigger::Type::Spike ? s.mean : s.norm;
        fires = non_finite || jumps(rule, key, value, median);
        break;
      default: continue;  // the health rules, above
      case Trigger::Type::When: {
        const std::optional<bool> answer = ask_predicate(t, s, error);
        rule.stopped = !answer;
        fires = answer.value_or(false);
        break;
      }
    }
    if (!fires || first) continue;
    // Once per run, or again once the cooldown has passed.
    // (As a difference: last_fired + cooldown overflows for a cooldown near
    // INT64_MAX, and the rule then fired every step.)
    if (rule.fired && (t.cooldown() == 0 || s.step - rule.last_fired < t.cooldown())) continue;
    rule.fired = true;
    rule.last_fired = s.step;
    first = dump_of(t, s, non_finite, value, median);
  }
  if (first) fired.insert(fired.begin(), std::move(*first));
  return fired;
}

}  // namespace detail
}  // namespace tensortap
