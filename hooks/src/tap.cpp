#include <tensortap/tap.h>

#include <ATen/ATen.h>

#include <tensortap/error.h>

#include "hooks/src/binding.h"

namespace tensortap {
namespace detail {

at::Tensor tap_capture(const TapBinding& b, at::Tensor x) {
  Core& core = *b.core;
  const bool want_act = core.active(Kind::Activation);
  const bool want_grad =
      core.active(Kind::ActivationGrad) && x.requires_grad() && at::GradMode::is_enabled();
  if (!want_act && !want_grad) return x;
  const std::int64_t step = core.current_step();
  if (want_act) core.record(Kind::Activation, b.name, x, step);
  if (!want_grad) return x;
  // The hook goes on a view, not on x: x may be a leaf or be used elsewhere,
  // and what we want is the gradient of what flows on from the tap point.
  at::Tensor y = x.view_as(x);
  y.register_hook([core = b.core, name = core.repeat_name(Kind::ActivationGrad, b.name, step),
                   step](const at::Tensor& grad) {
    try {
      core->record_as(Kind::ActivationGrad, name, grad, step);
    } catch (...) {
      core->hook_failed(std::current_exception());
    }
  });
  return y;
}

namespace {

// A child of an instrumented Sequential: calls the child, taps its output.
// It replaces the child only in the Sequential's list of modules to run, not
// among its registered children, so parameter names do not change.
class SequentialTapImpl : public torch::nn::Module, public TapPoint {
 public:
  explicit SequentialTapImpl(torch::nn::AnyModule inner) : inner_(std::move(inner)) {}
  std::shared_ptr<torch::nn::Module> clone(const torch::optional<torch::Device>& = torch::nullopt) const override {
    // SequentialImpl::clone() would register this wrapper as the child and
    // drop the layer's parameters from the copy: refuse rather than do that.
    throw Error(
        "tensortap: a Sequential tapped by tap_sequential() or Options::tap_sequential cannot be cloned; "
        "clone the model before watching it");
  }
  torch::Tensor forward(torch::Tensor x) {
    OpScope scope(*this);
    // The wrapper is not a registered child: eval() reaches the child only.
    return tap_output(inner_.forward(std::move(x)), inner_.ptr()->is_training());
  }

 private:
  torch::nn::AnyModule inner_;
};

}  // namespace
}  // namespace detail

void TapPoint::bind(std::shared_ptr<detail::TapBinding> binding) {
  std::lock_guard<std::mutex> lock(bindings_mu_);
  binding_.store(binding.get(), std::memory_order_release);
  bindings_.push_back(std::move(binding));
}

void TapPoint::unbind(const detail::TapBinding* binding) noexcept {
  std::lock_guard<std::mutex> lock(bindings_mu_);
  detail::TapBinding* expected = const_cast<detail::TapBinding*>(binding);
  binding_.compare_exchange_strong(expected, nullptr, std::memory_order_acq_rel);
}

torch::Tensor TapPoint::tap_output(torch::Tensor out, bool training) const {
  const detail::TapBinding* b = binding_.load(std::memory_order_acquire);
  if (b == nullptr || !(b->core->active(Kind::Activation) || b->core->active(Kind::ActivationGrad)))
    return out;
  if (!training && !b->core->options().capture_eval()) return out;
  try {
    const detail::OpQuiet quiet;
    return detail::tap_capture(*b, out);
  } catch (...) {
    b->core->hook_failed(std::current_exception());
    return out;
  }
}

TapPoint::OpScope::OpScope(const TapPoint& point) {
  const detail::TapBinding* b = point.binding_.load(std::memory_order_acquire);
  if (b == nullptr || !b->core->options().capture_ops() || !b->core->active(Kind::Activation)) return;
  detail::op_scope_push(b);
  pushed_ = true;
}

TapPoint::OpScope::~OpScope() {
  if (pushed_) detail::op_scope_pop();
}

TapImpl::TapImpl(const TapImpl& other)
    : torch::nn::Module(other), torch::nn::Cloneable<TapImpl>(other), TapPoint(other) {}

TapImpl& TapImpl::operator=(const TapImpl& other) {
  torch::nn::Cloneable<TapImpl>::operator=(other);
  return *this;
}

torch::Tensor TapImpl::forward(torch::Tensor x) { return tap_output(std::move(x), is_training()); }

void TapImpl::pretty_print(std::ostream& stream) const { stream << "tensortap::Tap"; }

torch::nn::AnyModule detail::make_sequential_tap(torch::nn::AnyModule inner) {
  if (dynamic_cast<TapPoint*>(inner.ptr().get()) != nullptr) return inner;  // already one
  return torch::nn::AnyModule(std::make_shared<SequentialTapImpl>(std::move(inner)));
}

void tap_sequential(torch::nn::SequentialImpl& seq) {
  for (torch::nn::AnyModule& m : seq) m = detail::make_sequential_tap(std::move(m));
}

}  // namespace tensortap
