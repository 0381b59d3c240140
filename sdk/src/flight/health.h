#pragma once

#include <cstdint>
#include <deque>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include <tensortap/trigger.h>

#include "sdk/src/core/pattern.h"

namespace tensortap::detail {

/// The nonlinearities the taps declare (run.json's "taps"): added by
/// watch() on the training thread, read by the rules on the writer thread.
class DeclaredTaps {
 public:
  void add(const std::vector<std::pair<std::string, std::string>>& taps);
  /// The word a tap named `name` declared ("relu", "tanh", ...), or "".
  std::string of(const std::string& name) const;

 private:
  mutable std::mutex mu_;
  std::unordered_map<std::string, std::string> words_;
};

/// One training health rule (`Trigger::vanishing_gradient()` and the rest)
/// evaluated live, on the writer thread, row by row of statistics: the
/// definitions of python/tensortap/_doctor.py's docstring, which `tensortap
/// doctor` evaluates offline over the same rows. It fires where the
/// doctor's episode opens (the patience-th evaluation in a row), once per
/// episode; an episode closes at the second evaluation in a row where the
/// condition does not hold, as offline. `weight_update_ratio` is not among
/// them: validate_triggers refuses it live.
class HealthRule {
 public:
  /// `t` is a health rule with valid parameters (validate_triggers).
  /// `taps` must outlive it: dead_relu and saturated_activation judge the
  /// taps it declares a ReLU's, or a tanh's or sigmoid's, output, besides
  /// those their `include` finds (unless the user set `include`).
  HealthRule(const Trigger& t, const DeclaredTaps& taps);

  /// Judges one statistics row; a firing as a dump without steps (reason and
  /// trigger the rule's name, the tensor, `value` its measure, `threshold`).
  /// `key`: the row's tensor, its kind's byte then its name (made once a row
  /// for every rule).
  std::optional<Dump> evaluate(const TensorSummary& s, const std::string& key);

 private:
  // Consecutive evaluations where the condition held, and the episode they
  // opened: fires at the patience-th.
  struct Streak {
    std::int64_t run = 0;
    int misses = 0;
    bool open = false;
    double extreme = 0;
    // Whether this evaluation opens an episode.
    bool update(bool cond, double measure, std::int64_t patience, bool largest);
  };
  // What a rule keeps of one tensor (kind and name).
  struct Series {
    bool found = false;     // its name is one `include` finds (or a declared tap the rule judges)
    bool sigmoid = false;   // saturated_activation: a sigmoid's, by its name or declared
    bool selected = false;  // found, and of a kind the rule judges
    std::int64_t rows = 0;  // rows seen (a param's first is its initialization)
    Streak streak;
    // unchanged_tensor: the previous row; tensor_variance: the last stds;
    // loss_not_decreasing: the window being filled and the window means.
    std::optional<TensorSummary> previous;
    std::deque<double> history;
    double window_sum = 0;
    std::int64_t window_count = 0;
    // loss_not_decreasing: the whole windows' means it compares, and how
    // many there were (k).
    double first_mean = 0, previous_mean = 0, lowest_mean = 0;
    std::int64_t windows = 0;
  };

  Series& series(const TensorSummary& s, const std::string& key);
  bool finds(const std::string& name) const;
  std::optional<Dump> fire(const TensorSummary& s, double value, double threshold) const;

  std::optional<Dump> exploding(const TensorSummary& s, Series& ser);
  std::optional<Dump> unchanged(const TensorSummary& s, Series& ser);
  std::optional<Dump> loss(const TensorSummary& s, Series& ser);
  std::optional<Dump> variance(const TensorSummary& s, Series& ser);
  std::optional<Dump> initialization(const TensorSummary& s, const Series& ser);

  Trigger t_;
  const DeclaredTaps& taps_;
  // Whether `include` is the rule's own: declared taps are judged then.
  bool default_include_ = false;
  // The project's automaton, not std::regex: linear in the name, no
  // recursion a long name could overflow the writer thread's stack with.
  Pattern include_;
  std::unordered_map<std::string, Series> series_;
  // exploding_tensor: the rank's evaluated steps and the blow-up they make.
  std::int64_t step_ = -1;
  bool step_exploded_ = false, in_blowup_ = false;
  int quiet_steps_ = 0;
  // unchanged_tensor: each selected name's grad rows (step, norm) since its
  // parameter's previous row.
  std::unordered_map<std::string, std::vector<std::pair<std::int64_t, double>>> grads_;
  // poor_weight_initialization: the first step's (name, std > 0), judged once
  // a row it selects of a later step comes (a run with one statistics step
  // is not judged live).
  std::int64_t init_step_ = -1;
  bool init_judged_ = false;
  std::vector<std::pair<std::string, double>> init_rows_;
};

/// numpy.median of `v` (not empty): the middle value, or the mean of the two
/// middle ones. The rules' medians (spike, norm_jump, tensor_variance).
double median_of(std::vector<double> v);

/// Whether a tap's name is a nonlinearity's input (`relu1_input`,
/// `tanh_input#2`): dead_relu never judges one; saturated_activation bounds
/// its values as an input's.
bool is_input_tap(const std::string& name);

}  // namespace tensortap::detail
