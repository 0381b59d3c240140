#include <tensortap/tap.h>

#include <ATen/ATen.h>

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
  // and what we want is the gradient of what flows on from the Tap.
  at::Tensor y = x.view_as(x);
  y.register_hook([core = b.core, name = core.repeat_name(Kind::ActivationGrad, b.name, step),
                   step](const at::Tensor& grad) { core->record_as(Kind::ActivationGrad, name, grad, step); });
  return y;
}

}  // namespace detail

TapImpl::TapImpl(const TapImpl& other) : torch::nn::Module(other), torch::nn::Cloneable<TapImpl>(other) {}

TapImpl& TapImpl::operator=(const TapImpl& other) {
  torch::nn::Cloneable<TapImpl>::operator=(other);
  return *this;
}

torch::Tensor TapImpl::forward(torch::Tensor x) {
  const detail::TapBinding* b = binding_.load(std::memory_order_acquire);
  if (b == nullptr || !(b->core->active(Kind::Activation) || b->core->active(Kind::ActivationGrad)))
    return x;
  return detail::tap_capture(*b, std::move(x));
}

void TapImpl::pretty_print(std::ostream& stream) const { stream << "tensortap::Tap"; }

void TapImpl::bind(std::shared_ptr<detail::TapBinding> binding) {
  std::lock_guard<std::mutex> lock(bindings_mu_);
  binding_.store(binding.get(), std::memory_order_release);
  bindings_.push_back(std::move(binding));
}

void TapImpl::unbind(const detail::TapBinding* binding) noexcept {
  std::lock_guard<std::mutex> lock(bindings_mu_);
  detail::TapBinding* expected = const_cast<detail::TapBinding*>(binding);
  binding_.compare_exchange_strong(expected, nullptr, std::memory_order_acq_rel);
}

}  // namespace tensortap
