#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include <tensortap/options.h>
#include <tensortap/trigger.h>

#include "sdk/src/flight/health.h"

namespace tensortap::detail {

/// The run's dump rules (Options::dump_on), evaluated on the writer thread
/// against each tensor's statistics. Keeps each rule's history: the last
/// `window` values of each series it watches, and when it last fired.
class Triggers {
 public:
  /// The rules of `options`, or non_finite() alone when it has none and the
  /// flight recorder is on.
  explicit Triggers(const Options& options);
  ~Triggers();

  bool empty() const { return rules_.empty(); }
  /// Whether non_finite() is among them: full tensors the flight recorder
  /// holds are then scanned for NaN and Inf even without statistics rows.
  bool checks_non_finite() const { return non_finite_; }

  /// Evaluates the rules on `s` (every rule, or non_finite() alone: a row
  /// that is no statistics row) and adds `s` to their histories; what fired,
  /// as dump records without steps: the first of the other rules that fires,
  /// then each health rule that fires (each opens an episode of its own).
  /// A predicate that throws stops its rule: `error` says so.
  std::vector<Dump> evaluate(const TensorSummary& s, bool only_non_finite, std::string& error);
  /// What the taps watch() bound declare (run.json's "taps"); any thread.
  void declare_taps(const std::vector<std::pair<std::string, std::string>>& taps) { taps_.add(taps); }

 private:
  struct Rule {
    Trigger trigger;
    // kind byte + name -> the last `window` values, oldest first.
    std::unordered_map<std::string, std::deque<double>> history;
    std::int64_t last_fired = -1;
    bool fired = false;
    bool stopped = false;
    // A training health rule's own state (sdk/src/flight/health.h).
    std::unique_ptr<HealthRule> health;
  };
  // Whether `rule` fires on `value` of the series `key`, against its history;
  // records the median in `median`. Adds `value` to the history.
  static bool jumps(Rule& rule, const std::string& key, double value, double& median);
  // Before rules_: their health rules read it.
  DeclaredTaps taps_;
  std::vector<Rule> rules_;
  bool non_finite_ = false;
};

/// Throws `Error` if `options`' rules are malformed or lack the statistics
/// they look at.
void validate_triggers(const Options& options);

}  // namespace tensortap::detail
