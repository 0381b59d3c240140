#pragma once

// Part of <tensortap/tap.h>, which includes it: the templates `TappedImpl<M>`
// is built from. Not an interface: names here may change in any release.

#include <memory>
#include <tuple>
#include <type_traits>
#include <utility>

#include <torch/nn/cloneable.h>
#include <torch/nn/module.h>
#include <torch/version.h>
#if TORCH_VERSION_MAJOR < 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR < 2)
// For detail::Derivable (1.13's instancenorm.h does not include what it uses).
#include <torch/nn/functional/instancenorm.h>
#include <torch/nn/modules/batchnorm.h>
#include <torch/nn/modules/instancenorm.h>
#endif

namespace tensortap {

namespace detail {

// Module's hooks for default forward arguments are protected virtuals; a
// using-declaration in a derived class makes them nameable, and a call
// through the member pointer still dispatches to the wrapped module's own.
struct ModuleAccess : torch::nn::Module {
  using torch::nn::Module::_forward_has_default_args;
  using torch::nn::Module::_forward_num_required_args;
  using torch::nn::Module::_forward_populate_default_args;
};

// Whether a forward's result is something Tapped<M> can capture: a tensor,
// or a tuple of tensors and such tuples (LSTM's output and state).
template <class T>
struct Capturable : std::is_same<T, torch::Tensor> {};
template <class... T>
struct Capturable<std::tuple<T...>> : std::conjunction<Capturable<std::decay_t<T>>...> {};

// Whether TappedImpl<Impl> can derive from Impl, and so be one wherever
// LibTorch's code looks (as<M>(), apply(), clone_, pretty_print): it copies
// an Impl to clone it, so a user's module that cannot be copied (a mutex or
// a unique_ptr member) or is final is wrapped instead (TappedBase below).
// So are LibTorch's BatchNorm and InstanceNorm while Module is a virtual
// base (up to 2.1): 1.13 does not export their pretty_print, which a
// derived class's construction vtables name.
template <class Impl>
struct Derivable : std::bool_constant<std::is_copy_constructible_v<Impl> && std::is_copy_assignable_v<Impl> &&
                                      !std::is_final_v<Impl>> {};
#if TORCH_VERSION_MAJOR < 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR < 2)
template <>
struct Derivable<torch::nn::BatchNorm1dImpl> : std::false_type {};
template <>
struct Derivable<torch::nn::BatchNorm2dImpl> : std::false_type {};
template <>
struct Derivable<torch::nn::BatchNorm3dImpl> : std::false_type {};
template <>
struct Derivable<torch::nn::InstanceNorm1dImpl> : std::false_type {};
template <>
struct Derivable<torch::nn::InstanceNorm2dImpl> : std::false_type {};
template <>
struct Derivable<torch::nn::InstanceNorm3dImpl> : std::false_type {};
#endif

// Builds a TappedImpl from a plain Impl that is a deep copy (clone()).
struct FromPlain {};

// What a TappedImpl is besides a tap point: the Impl itself ...
template <class Impl, bool = Derivable<Impl>::value>
class TappedBase : public Impl {
 protected:
  template <class... Args>
  explicit TappedBase(Args&&... args) : Impl(std::forward<Args>(args)...) {
    // Module::name() is the dynamic type's, asked for late: this module's
    // would be TappedCalls<...>, in what pretty_print shows (RNNCell's) and
    // in LibTorch's errors. A plain copy's name is Impl's; assigning its
    // Module part, the same tensors and children as this one's, takes it.
    if constexpr (std::is_copy_constructible_v<Impl>) {
      const Impl plain(static_cast<const Impl&>(*this));
      (void)plain.name();
      static_cast<torch::nn::Module&>(*this) = static_cast<const torch::nn::Module&>(plain);
    }
  }
  Impl& impl() { return *this; }
  const Impl& impl() const { return *this; }
  // A deep copy as a plain Impl: Cloneable<Impl>'s own.
  std::shared_ptr<Impl> plain_clone(const c10::optional<torch::Device>& device) const {
    return std::dynamic_pointer_cast<Impl>(Impl::clone(device));
  }
};

// ... or, where it cannot derive (Derivable), a module that holds an Impl
// and takes its parameters, buffers and children as its own, by name: the
// same tensors, so an optimizer, a checkpoint or to() sees one set.
template <class Impl>
class TappedBase<Impl, false> : public torch::nn::Module {
 public:
  void train(bool on = true) override {
    torch::nn::Module::train(on);
    inner_->train(on);
  }
  void pretty_print(std::ostream& stream) const override { inner_->pretty_print(stream); }

 protected:
  template <class... Args>
  explicit TappedBase(Args&&... args) : inner_(std::make_shared<Impl>(std::forward<Args>(args)...)) {
    adopt();
  }
  explicit TappedBase(FromPlain, std::shared_ptr<Impl> plain) : inner_(std::move(plain)) { adopt(); }
  Impl& impl() { return *inner_; }
  const Impl& impl() const { return *inner_; }
  std::shared_ptr<Impl> plain_clone(const c10::optional<torch::Device>& device) const {
    return std::dynamic_pointer_cast<Impl>(inner_->clone(device));
  }

  // What Sequential (AnyModule) asks about defaulted forward arguments: the
  // wrapped module's answers.
  bool _forward_has_default_args() override {
    return (static_cast<torch::nn::Module&>(*inner_).*&ModuleAccess::_forward_has_default_args)();
  }
  unsigned int _forward_num_required_args() override {
    return (static_cast<torch::nn::Module&>(*inner_).*&ModuleAccess::_forward_num_required_args)();
  }
  std::vector<torch::nn::AnyValue> _forward_populate_default_args(
      std::vector<torch::nn::AnyValue>&& arguments) override {
    return (static_cast<torch::nn::Module&>(*inner_).*&ModuleAccess::_forward_populate_default_args)(
        std::move(arguments));
  }

 private:
  // A parent's clone() builds its children afresh (reset()) and then has
  // each copy itself from the original: this one takes a deep copy's
  // Impl, parameters and all. Module's default does nothing, which left
  // fresh random weights in a cloned model.
  void clone_(torch::nn::Module& other, const c10::optional<torch::Device>& device) override {
    auto copy = std::dynamic_pointer_cast<TappedBase>(other.clone(device));
    TORCH_CHECK(copy != nullptr, "tensortap::Tapped<M>: cannot clone a module of another type into it");
    torch::nn::Module::operator=(static_cast<const torch::nn::Module&>(*copy));
    inner_ = copy->inner_;
  }

  void adopt() {
    for (const auto& p : inner_->named_parameters(/*recurse=*/false))
      register_parameter(p.key(), p.value(), p.value().requires_grad());
    for (const auto& b : inner_->named_buffers(/*recurse=*/false)) register_buffer(b.key(), b.value());
    for (const auto& c : inner_->named_children()) register_module(c.key(), c.value());
    torch::nn::Module::train(inner_->is_training());
  }

  std::shared_ptr<Impl> inner_;
};

template <class Impl>
class TappedCalls;

}  // namespace detail

}  // namespace tensortap
