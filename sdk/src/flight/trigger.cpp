// The public Trigger (sdk/include/tensortap/trigger.h): its factories, with
// the health rules' defaults, its setters and its names. What a run does
// with its rules is triggers.cpp's (evaluation, validation) and health.cpp's.
#include <tensortap/trigger.h>

#include <cstring>
#include <utility>

#include "sdk/src/sinks/trigger_params.h"

namespace tensortap {

Trigger Trigger::non_finite() { return Trigger(Type::NonFinite); }

Trigger Trigger::spike(std::string name, double factor, std::int64_t window) {
  Trigger t(Type::Spike);
  t.name_ = std::move(name);
  t.factor_ = factor;
  t.window_ = window;
  return t;
}

Trigger Trigger::norm_jump(double factor, std::int64_t window) {
  Trigger t(Type::NormJump);
  t.factor_ = factor;
  t.window_ = window;
  return t;
}

Trigger Trigger::when(std::function<bool(const TensorSummary&)> predicate) {
  Trigger t(Type::When);
  t.predicate_ = std::move(predicate);
  return t;
}

// The health rules with the doctor's defaults (python/tensortap/_doctor.py's
// PARAMETERS; tests/python/test_doctor.py holds the two tables together).
Trigger Trigger::vanishing_gradient() {
  Trigger t(Type::VanishingGradient);
  t.kinds_ = KindSet{Kind::Grad};
  t.include_ = "weight";
  t.threshold_ = 1e-7;
  t.patience_ = 3;
  return t;
}

Trigger Trigger::exploding_tensor() {
  Trigger t(Type::ExplodingTensor);
  t.kinds_ = KindSet::all();
  return t;
}

Trigger Trigger::all_zero() {
  Trigger t(Type::AllZero);
  t.kinds_ = KindSet{Kind::Activation, Kind::ActivationGrad, Kind::Param, Kind::Grad};
  t.patience_ = 2;
  return t;
}

Trigger Trigger::unchanged_tensor() {
  Trigger t(Type::UnchangedTensor);
  t.include_ = "weight";
  t.num_steps_ = 3;
  return t;
}

Trigger Trigger::loss_not_decreasing(std::string name) {
  Trigger t(Type::LossNotDecreasing);
  t.name_ = std::move(name);
  t.window_ = 20;
  t.min_decrease_ = 0.001;
  t.min_progress_ = 0.05;
  return t;
}

Trigger Trigger::dead_relu() {
  Trigger t(Type::DeadRelu);
  t.include_ = "relu";
  t.threshold_ = 0.95;
  t.patience_ = 3;
  return t;
}

Trigger Trigger::saturated_activation() {
  Trigger t(Type::SaturatedActivation);
  t.include_ = "tanh|sigmoid";
  t.derivative_ = 0.1;
  t.threshold_ = 0.5;
  t.patience_ = 3;
  return t;
}

Trigger Trigger::tensor_variance() {
  Trigger t(Type::TensorVariance);
  t.kinds_ = KindSet{Kind::Activation, Kind::ActivationGrad, Kind::Param, Kind::Grad};
  t.factor_ = 100;
  t.window_ = 50;
  return t;
}

Trigger Trigger::poor_weight_initialization() {
  Trigger t(Type::PoorWeightInitialization);
  t.include_ = "(relu|tanh|sigmoid).*_input";
  t.threshold_ = 10;
  return t;
}

Trigger Trigger::weight_update_ratio() {
  Trigger t(Type::WeightUpdateRatio);
  t.include_ = "weight";
  t.large_ = 0.1;
  t.small_ = 1e-8;
  t.patience_ = 1;
  return t;
}

Trigger& Trigger::cooldown(std::int64_t steps) {
  cooldown_ = steps;
  return *this;
}

void Trigger::set(const char* parameter) {
  const std::uint32_t has = detail::trigger_params(type_);
  for (std::uint32_t bit = 1; bit <= detail::kParamSmall; bit <<= 1)
    if (std::strcmp(detail::trigger_param_name(static_cast<detail::TriggerParam>(bit)), parameter) == 0) {
      if ((has & bit) == 0 && foreign_.empty()) foreign_ = parameter;
      return;
    }
}

Trigger& Trigger::kinds(KindSet kinds) {
  set("kinds");
  kinds_ = kinds;
  return *this;
}
Trigger& Trigger::include(std::string pattern) {
  set("include");
  include_ = std::move(pattern);
  return *this;
}
Trigger& Trigger::threshold(double threshold) {
  set("threshold");
  threshold_ = threshold;
  return *this;
}
Trigger& Trigger::patience(std::int64_t evaluations) {
  set("patience");
  patience_ = evaluations;
  return *this;
}
Trigger& Trigger::bound(double bound) {
  set("bound");
  bound_ = bound;
  return *this;
}
Trigger& Trigger::num_steps(std::int64_t steps) {
  set("num_steps");
  num_steps_ = steps;
  return *this;
}
Trigger& Trigger::window(std::int64_t window) {
  set("window");
  window_ = window;
  return *this;
}
Trigger& Trigger::factor(double factor) {
  set("factor");
  factor_ = factor;
  return *this;
}
Trigger& Trigger::name(std::string name) {
  set("name");
  name_ = std::move(name);
  return *this;
}
Trigger& Trigger::min_decrease(double fraction) {
  set("min_decrease");
  min_decrease_ = fraction;
  return *this;
}
Trigger& Trigger::min_progress(double fraction) {
  set("min_progress");
  min_progress_ = fraction;
  return *this;
}
Trigger& Trigger::derivative(double fraction) {
  set("derivative");
  derivative_ = fraction;
  return *this;
}
Trigger& Trigger::large(double ratio) {
  set("large");
  large_ = ratio;
  return *this;
}
Trigger& Trigger::small(double ratio) {
  set("small");
  small_ = ratio;
  return *this;
}

const char* Trigger::type_name() const {
  switch (type_) {
    case Type::NonFinite: return "non_finite";
    case Type::Spike: return "spike";
    case Type::NormJump: return "norm_jump";
    case Type::When: return "when";
    case Type::VanishingGradient: return "vanishing_gradient";
    case Type::ExplodingTensor: return "exploding_tensor";
    case Type::AllZero: return "all_zero";
    case Type::UnchangedTensor: return "unchanged_tensor";
    case Type::LossNotDecreasing: return "loss_not_decreasing";
    case Type::DeadRelu: return "dead_relu";
    case Type::SaturatedActivation: return "saturated_activation";
    case Type::TensorVariance: return "tensor_variance";
    case Type::PoorWeightInitialization: return "poor_weight_initialization";
    case Type::WeightUpdateRatio: return "weight_update_ratio";
  }
  return "unknown";
}

}  // namespace tensortap
