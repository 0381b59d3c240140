#include "sdk/src/flight/health.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "writers/src/check.h"

namespace tensortap::detail {
namespace {

using Type = Trigger::Type;

bool clean(const TensorSummary& s) { return s.nan == 0 && s.posinf == 0 && s.neginf == 0 && s.numel > 0; }

bool all_stats_equal(const TensorSummary& a, const TensorSummary& b) {
  return a.min == b.min && a.max == b.max && a.mean == b.mean && a.std == b.std && a.norm == b.norm &&
         a.nan == b.nan && a.posinf == b.posinf && a.neginf == b.neginf && a.zeros == b.zeros && a.numel == b.numel;
}

// The kinds a rule judges when it has no `kinds` parameter of its own.
bool judges_kind(const Trigger& t, Kind k) {
  switch (t.type()) {
    case Type::UnchangedTensor: return k == Kind::Param;
    case Type::LossNotDecreasing: return k == Kind::Tensor;
    case Type::DeadRelu:
    case Type::SaturatedActivation:
    case Type::PoorWeightInitialization: return k == Kind::Activation;
    default: return t.kinds().contains(k);
  }
}

// The saturated fraction's lower bound from a row (the doctor's
// saturation_bounds and its statistics branch).
double saturated_fraction(const TensorSummary& s, double derivative, bool sigmoid) {
  const bool input = is_input_tap(s.name);
  const double t = std::sqrt(1.0 - derivative);
  const double a = input ? (sigmoid ? 2 * std::atanh(t) : std::atanh(t)) : t;
  const double n = static_cast<double>(s.numel);
  double ms = s.norm * s.norm / n, lo = s.min, hi = s.max;
  if (sigmoid && !input) {
    ms = 4 * ms - 4 * s.mean + 1;
    lo = 2 * lo - 1;
    hi = 2 * hi - 1;
  }
  const double top = std::max(std::fabs(lo), std::fabs(hi));
  const double room = top * top - a * a;
  if (!(room > 0)) return 0;
  return std::clamp((ms - a * a) / room, 0.0, 1.0);
}

}  // namespace

double median_of(std::vector<double> v) {
  const std::size_t n = v.size(), mid = n / 2;
  std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(mid), v.end());
  const double hi = v[mid];
  if (n % 2 != 0) return hi;
  return (*std::max_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(mid)) + hi) / 2;
}

bool is_input_tap(const std::string& name) {
  // _input(#\d+)?$, ASCII letters without regard to case.
  std::size_t end = name.size();
  const std::size_t hash = name.rfind('#');
  if (hash != std::string::npos && hash + 1 < name.size() &&
      std::all_of(name.begin() + static_cast<std::ptrdiff_t>(hash) + 1, name.end(),
                  [](char c) { return c >= '0' && c <= '9'; }))
    end = hash;
  static const char kInput[] = "_input";
  constexpr std::size_t kLen = sizeof(kInput) - 1;
  if (end < kLen) return false;
  for (std::size_t i = 0; i < kLen; ++i) {
    char c = name[end - kLen + i];
    if (c >= 'A' && c <= 'Z') c = static_cast<char>(c - 'A' + 'a');
    if (c != kInput[i]) return false;
  }
  return true;
}

bool HealthRule::Streak::update(bool cond, double measure, std::int64_t patience, bool largest) {
  if (open) {
    // A gap of one evaluation is bridged; the second in a row closes it.
    if (cond)
      misses = 0;
    else if (++misses >= 2) {
      open = false;
      run = 0;
    }
    return false;
  }
  if (!cond) {
    run = 0;
    return false;
  }
  extreme = run == 0 ? measure : largest ? std::max(extreme, measure) : std::min(extreme, measure);
  if (++run < patience) return false;
  open = true;
  misses = 0;
  return true;
}

void DeclaredTaps::add(const std::vector<std::pair<std::string, std::string>>& taps) {
  std::lock_guard<std::mutex> lock(mu_);
  for (const auto& [name, word] : taps) words_[name] = word;
}

std::string DeclaredTaps::of(const std::string& name) const {
  std::lock_guard<std::mutex> lock(mu_);
  const auto it = words_.find(name);
  return it == words_.end() ? std::string() : it->second;
}

namespace {

// The rule's own include, as its factory sets it.
std::string default_include(Type type) {
  switch (type) {
    case Type::DeadRelu: return Trigger::dead_relu().include();
    case Type::SaturatedActivation: return Trigger::saturated_activation().include();
    default: return "";
  }
}

}  // namespace

HealthRule::HealthRule(const Trigger& t, const DeclaredTaps& taps)
    : t_(t),
      taps_(taps),
      default_include_(!t.include().empty() && t.include() == default_include(t.type())),
      include_(t.include(), "include", /*ignore_case=*/true) {}

bool HealthRule::finds(const std::string& name) const { return include_.empty() || include_.search(name); }

HealthRule::Series& HealthRule::series(const TensorSummary& s, const std::string& key) {
  auto [it, fresh] = series_.try_emplace(key);
  // The selection is decided once per tensor: a pattern search per row
  // would cost the writer thread more than the rule.
  if (fresh) {
    Series& ser = it->second;
    ser.found = finds(s.name);
    // A tap's declared nonlinearity (a Tap's, or its module's type): judged
    // whatever its name, as `tensortap doctor` judges run.json's "taps".
    const std::string word = t_.type() == Type::DeadRelu || t_.type() == Type::SaturatedActivation
                                 ? taps_.of(s.name)
                                 : std::string();
    if (default_include_ && !word.empty()) {
      if (t_.type() == Type::DeadRelu) ser.found = ser.found || word == "relu" || word == "relu6";
      if (t_.type() == Type::SaturatedActivation) ser.found = ser.found || word == "tanh" || word == "sigmoid";
    }
    std::string lower = s.name;
    for (char& c : lower) c = static_cast<char>(c >= 'A' && c <= 'Z' ? c - 'A' + 'a' : c);
    ser.sigmoid = word == "sigmoid" || (word.empty() && lower.find("sigmoid") != std::string::npos);
    ser.selected = ser.found && judges_kind(t_, s.kind);
    if (t_.type() == Type::DeadRelu && is_input_tap(s.name)) ser.selected = false;
    if (t_.type() == Type::LossNotDecreasing) ser.selected = s.kind == Kind::Tensor && s.name == t_.name();
  }
  return it->second;
}

std::optional<Dump> HealthRule::fire(const TensorSummary& s, double value, double threshold) const {
  Dump d;
  d.step = s.step;
  d.trigger = t_.type_name();
  d.reason = d.trigger;
  d.kind = s.kind;
  d.name = s.name;
  d.value = value;
  d.threshold = threshold;
  return d;
}

std::optional<Dump> HealthRule::evaluate(const TensorSummary& s, const std::string& key) {
  Series& ser = series(s, key);
  switch (t_.type()) {
    case Type::ExplodingTensor: return exploding(s, ser);
    case Type::PoorWeightInitialization: return initialization(s, ser);
    case Type::UnchangedTensor: {
      // Every grad row of a name the rule could judge: a gradient that
      // reached the parameter tells it from a frozen one.
      if (s.kind == Kind::Grad && s.numel > 0 && ser.found) {
        auto& rows = grads_[s.name];
        rows.emplace_back(s.step, clean(s) ? s.norm : HUGE_VAL);
        // Bounded, for a name whose parameter is recorded rarely or never:
        // the evaluation wants the last row before its step, which a row
        // that comes later never displaces.
        if (rows.size() > 64) rows.erase(rows.begin());
      }
      break;
    }
    default: break;
  }
  if (!ser.selected) return std::nullopt;
  // A parameter's first row is its initialization (all_zero exempts it).
  const bool first_row = ser.rows++ == 0;
  if (!clean(s)) {
    // Not an evaluation, nor what the next one compares with.
    if (t_.type() == Type::UnchangedTensor) ser.previous.reset();
    return std::nullopt;
  }
  const double n = static_cast<double>(s.numel);
  const std::int64_t patience = t_.patience();
  switch (t_.type()) {
    case Type::VanishingGradient: {
      const double rms = s.norm / std::sqrt(n);
      if (ser.streak.update(rms < t_.threshold(), rms, patience, false))
        return fire(s, ser.streak.extreme, t_.threshold());
      return std::nullopt;
    }
    case Type::AllZero: {
      // A parameter's first row is its initialization: zero on purpose
      // (BatchNorm biases, zero-initialized gates, LoRA's B).
      if (s.kind == Kind::Param && first_row) return std::nullopt;
      if (ser.streak.update(s.zeros == s.numel, static_cast<double>(s.zeros) / n, patience, true))
        return fire(s, ser.streak.extreme, 1.0);
      return std::nullopt;
    }
    case Type::DeadRelu: {
      const double f = static_cast<double>(s.zeros) / n;
      if (ser.streak.update(f > t_.threshold(), f, patience, true)) return fire(s, ser.streak.extreme, t_.threshold());
      return std::nullopt;
    }
    case Type::SaturatedActivation: {
      const double f = saturated_fraction(s, t_.derivative(), ser.sigmoid);
      if (ser.streak.update(f > t_.threshold(), f, patience, true)) return fire(s, ser.streak.extreme, t_.threshold());
      return std::nullopt;
    }
    case Type::UnchangedTensor: return unchanged(s, ser);
    case Type::LossNotDecreasing: return loss(s, ser);
    case Type::TensorVariance: return variance(s, ser);
    default: return std::nullopt;
  }
}

std::optional<Dump> HealthRule::exploding(const TensorSummary& s, Series& ser) {
  if (s.numel <= 0 || !ser.selected) return std::nullopt;
  // The rank's evaluated steps: a step with a selected row. A blow-up goes on
  // over one quiet step and ends at the second.
  if (s.step > step_) {
    if (step_ >= 0 && !step_exploded_ && in_blowup_ && ++quiet_steps_ >= 2) in_blowup_ = false;
    step_ = s.step;
    step_exploded_ = false;
  }
  const std::int64_t nonfinite = s.nan + s.posinf + s.neginf;
  const double largest = std::max(std::fabs(s.min), std::fabs(s.max));
  const bool explodes = nonfinite > 0 || (t_.bound() > 0 && largest > t_.bound());
  if (!explodes) return std::nullopt;
  step_exploded_ = true;
  quiet_steps_ = 0;
  if (in_blowup_) return std::nullopt;
  in_blowup_ = true;
  if (nonfinite > 0) return fire(s, static_cast<double>(nonfinite), 0.0);
  return fire(s, largest, t_.bound());
}

std::optional<Dump> HealthRule::unchanged(const TensorSummary& s, Series& ser) {
  std::optional<Dump> out;
  if (ser.previous) {
    const std::int64_t from = ser.previous->step;
    // The last grad row of the name at a step in [previous step, this step).
    double gnorm = std::nan("");
    auto it = grads_.find(s.name);
    if (it != grads_.end())
      for (const auto& [step, norm] : it->second)
        if (from <= step && step < s.step) gnorm = norm;
    const bool cond = all_stats_equal(s, *ser.previous) && gnorm > 0;
    if (ser.streak.update(cond, std::isnan(gnorm) ? 0.0 : gnorm, t_.num_steps() - 1, true))
      out = fire(s, ser.streak.extreme, 0.0);
  }
  ser.previous = s;
  // Only rows from this step on can matter to the next evaluation.
  auto it = grads_.find(s.name);
  if (it != grads_.end()) {
    auto& rows = it->second;
    rows.erase(std::remove_if(rows.begin(), rows.end(), [&](const auto& r) { return r.first < s.step; }), rows.end());
  }
  return out;
}

std::optional<Dump> HealthRule::loss(const TensorSummary& s, Series& ser) {
  ser.window_sum += s.mean;
  if (++ser.window_count < t_.window()) return std::nullopt;
  const double a = ser.window_sum / static_cast<double>(ser.window_count);
  ser.window_sum = 0;
  ser.window_count = 0;
  const double b = ser.previous_mean;
  ser.previous_mean = a;
  if (ser.windows++ == 0) {
    ser.first_mean = ser.lowest_mean = a;
    return std::nullopt;
  }
  ser.lowest_mean = std::min(ser.lowest_mean, a);
  const double first = ser.first_mean, lowest = ser.lowest_mean;
  const double scale = std::fabs(b);
  const double decrease = scale > 0 ? (b - a) / scale : 0.0;
  const bool cond = b - a <= t_.min_decrease() * scale && lowest > first - t_.min_progress() * std::fabs(first);
  if (ser.streak.update(cond, decrease, 1, false)) return fire(s, ser.streak.extreme, t_.min_decrease());
  return std::nullopt;
}

std::optional<Dump> HealthRule::variance(const TensorSummary& s, Series& ser) {
  std::optional<Dump> out;
  const std::size_t need = static_cast<std::size_t>(std::min<std::int64_t>(t_.window(), 3));
  if (ser.history.size() >= need) {
    const double median = median_of(std::vector<double>(ser.history.begin(), ser.history.end()));
    if (median > 0) {
      const double ratio = s.std / median;
      const double factor = t_.factor();
      const bool cond = ratio > factor || ratio < 1 / factor;
      // The extreme is the ratio farthest from 1, either way.
      const double spread = std::fabs(std::log(ratio > 0 ? ratio : std::numeric_limits<double>::min()));
      if (ser.streak.update(cond, spread, 1, true)) out = fire(s, ratio, ratio > 1 ? factor : 1 / factor);
    }
  }
  ser.history.push_back(s.std);
  if (static_cast<std::int64_t>(ser.history.size()) > t_.window()) ser.history.pop_front();
  return out;
}

std::optional<Dump> HealthRule::initialization(const TensorSummary& s, const Series& ser) {
  if (init_judged_ || !ser.selected) return std::nullopt;
  // The first step's rows are complete once a selected row of a later step
  // comes (another kind's rows, or a CPU tensor's, may come before the
  // copier's).
  if (init_step_ >= 0 && s.step > init_step_) {
    init_judged_ = true;
    if (init_rows_.size() < 2) return std::nullopt;
    const auto by_std = [](const auto& x, const auto& y) { return x.second < y.second; };
    const auto lo = std::min_element(init_rows_.begin(), init_rows_.end(), by_std);
    const auto hi = std::max_element(init_rows_.begin(), init_rows_.end(), by_std);
    const double ratio = hi->second / lo->second;
    if (!(ratio > t_.threshold())) return std::nullopt;
    TensorSummary at;
    at.step = init_step_;
    at.kind = Kind::Activation;
    at.name = hi->first;
    return fire(at, ratio, t_.threshold());
  }
  if (!clean(s)) return std::nullopt;
  if (init_step_ < 0) init_step_ = s.step;
  if (s.step == init_step_ && s.std > 0) init_rows_.emplace_back(s.name, s.std);
  return std::nullopt;
}

}  // namespace tensortap::detail
