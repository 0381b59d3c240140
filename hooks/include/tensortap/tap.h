#pragma once

// Lets tensortap/detail/tapped_calls.h, which needs TappedImpl, refuse to be
// included on its own.
#define TENSORTAP_TAP_H_INCLUDED

#include <atomic>
#include <memory>
#include <mutex>
#include <ostream>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include <torch/nn/cloneable.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/container/any_value.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/pimpl.h>
#include <torch/version.h>

// The templates TappedImpl<M> is built from (`detail::`), apart so that
// this file reads as the interface.
#include <tensortap/detail/tapped_base.h>

namespace tensortap {

namespace detail {
struct TapBindings;
class TapPointAccess;
}  // namespace detail

/// The nonlinearity whose output flows through a tap point. The health
/// rules judge a tap by it (dead_relu: a ReLU's; saturated_activation: a
/// tanh's or a sigmoid's), live and in `tensortap doctor` (run.json's
/// "taps"), whatever the tap's name. A `Tapped<M>` of one of LibTorch's
/// activation modules, or an instrumented `Sequential`'s child that is
/// one, says it by its type; a `Tap` says it where it is made:
/// `tensortap::Tap(tensortap::Nonlinearity::ReLU)`.
enum class Nonlinearity { None, ReLU, ReLU6, LeakyReLU, ELU, GELU, SiLU, Softplus, Tanh, Sigmoid, Hardtanh };

/// A place in a model whose output a recorder captures: kind `activation`,
/// and through a hook on it, `activation_grad`. `Tap`, `Tapped<M>` and the
/// children of an instrumented `Sequential` are tap points; `watch()` binds
/// every tap point in the module tree under its module path. A tap point
/// feeds every recorder bound to it (a statistics-only recorder beside a
/// full one, say). An unbound tap point costs one atomic load; a bound one
/// on a step that is not sampled, a few more.
class TapPoint {
 public:
  TapPoint();
  /// Copies (module clones) are not bound to any recorder.
  TapPoint(const TapPoint&);
  TapPoint& operator=(const TapPoint&) { return *this; }
  virtual ~TapPoint();

  /// Says what flows through this point (see `Nonlinearity`); before
  /// `watch()`, which reads it. `None` (the default): the module's type
  /// says it, if it is one of LibTorch's activation modules, or nothing.
  void set_nonlinearity(Nonlinearity n) { nonlinearity_ = n; }
  Nonlinearity nonlinearity() const { return nonlinearity_; }

 protected:
  /// Captures `out` for each bound recorder whose step is sampled (and,
  /// unless its options say so, only in training mode), under the point's
  /// name followed by `suffix`. Returns `out`, or a view of it that carries
  /// the gradient hooks.
  torch::Tensor tap_output(torch::Tensor out, bool training, const std::string& suffix = "") const;

  /// While alive, ATen ops run on this thread are attributed to this tap
  /// point for op-level capture (`Options::capture_ops`).
  class OpScope {
   public:
    explicit OpScope(const TapPoint& point);
    ~OpScope();
    OpScope(const OpScope&) = delete;
    OpScope& operator=(const OpScope&) = delete;

   private:
    const TapPoint* point_ = nullptr;
  };

 private:
  friend class detail::TapPointAccess;
  // The bound recorders, an immutable list read on every forward without a
  // lock and replaced whole when a recorder binds or unbinds. A replaced
  // list is freed only once no forward is reading (`readers_` is 0), so a
  // forward racing with a recorder's close() never reads freed memory, and
  // a closed recorder is not kept alive by the model.
  std::atomic<const detail::TapBindings*> bindings_{nullptr};
  mutable std::atomic<int> readers_{0};
  std::mutex lists_mu_;
  // The current list (last) and replaced ones not yet freed.
  std::vector<std::unique_ptr<const detail::TapBindings>> lists_;
  Nonlinearity nonlinearity_ = Nonlinearity::None;
};

/// An identity module that marks a tap point: what flows through it is
/// captured under its path in the module tree.
///
/// LibTorch has no forward hooks (pytorch issue 25888), so a Tap marks the
/// place instead: put one where you want to see the activations.
///
/// Example:
/// ```
/// struct NetImpl : torch::nn::Module {
///   torch::nn::Linear fc1{784, 128}, fc2{128, 10};
///   // captured as "hidden"; a ReLU's output, which the health rules judge
///   tensortap::Tap hidden{tensortap::Nonlinearity::ReLU};
///   NetImpl() {
///     register_module("fc1", fc1);
///     register_module("hidden", hidden);
///     register_module("fc2", fc2);
///   }
///   torch::Tensor forward(torch::Tensor x) {
///     return fc2(hidden(torch::relu(fc1(x))));
///   }
/// };
/// ```
class TapImpl : public torch::nn::Cloneable<TapImpl>, public TapPoint {
 public:
  TapImpl() = default;
  /// A tap on the output of `after` (`set_nonlinearity`).
  explicit TapImpl(Nonlinearity after) { set_nonlinearity(after); }
  /// A clone is not bound to any recorder.
  TapImpl(const TapImpl& other);
  /// Used by `clone()` into an existing module: the target keeps its own
  /// binding.
  TapImpl& operator=(const TapImpl& other);

  void reset() override {}
  /// Returns `x` (or, on a step that captures its gradient, a view of it).
  torch::Tensor forward(torch::Tensor x);
  void pretty_print(std::ostream& stream) const override;
};

/// A `ModuleHolder` for `TapImpl`, like `torch::nn::Linear` for `LinearImpl`.
TORCH_MODULE(Tap);


/// A module of type `Impl` (e.g. `torch::nn::LinearImpl`) whose output is a
/// tap point. It is an `Impl`, built from the same constructor arguments,
/// with the same parameters, buffers and submodules under the same names:
/// it replaces the plain module without touching `forward()` or a
/// checkpoint, and LibTorch's own code treats it as the plain module
/// (`as<M>()` in `apply()`, `clone()`, `pretty_print`, `to()`, `train()`,
/// serialization). A `clone()` is a `TappedImpl` again, not bound to any
/// recorder. `forward()` takes exactly `Impl::forward`'s arguments, also
/// inside a `Sequential`; through the holder, `m(x)` and `m->forward(x)`
/// also take them with trailing defaulted arguments left out. A tensor
/// output is captured under the module's path; a tuple's tensors (LSTM,
/// GRU, MultiheadAttention) under `<path>.0`, `<path>.1`, nested ones
/// `<path>.1.0`. A module whose `forward` returns anything else is refused
/// at compile time. `inner()` is the module as an `Impl`.
///
/// A module that cannot be copied (a user's, with a mutex or a `unique_ptr`
/// member) or is `final` is held instead of derived from, as are
/// `BatchNorm*d` and `InstanceNorm*d` with LibTorch 1.13 (it does not export
/// what a derived class needs): everything above holds except `as<M>()`,
/// which finds no `M` there; use `inner()`.
template <class Impl, class Forward = decltype(&Impl::forward)>
class TappedImpl;

template <class Impl, class R, class C, class... A>
class TappedImpl<Impl, R (C::*)(A...)> : public detail::TappedBase<Impl>, public TapPoint {
  static_assert(detail::Capturable<std::decay_t<R>>::value,
                "tensortap::Tapped<M>: M::forward must return a torch::Tensor or a std::tuple of them; "
                "capture other outputs with Recorder::capture() or a tensortap::Tap after the module");
  using Base = detail::TappedBase<Impl>;

 public:
  using Result = R;
  static constexpr std::size_t kArity = sizeof...(A);

  R forward(A... args) {
    OpScope scope(*this);
    return tap_result(this->impl().forward(std::forward<A>(args)...), "");
  }

  /// `forward()` with its trailing defaulted arguments left out, as a call
  /// through the holder (`tapped(x)`) does: the defaults are the wrapped
  /// module's own (its `FORWARD_HAS_DEFAULT_ARGS`).
  template <class... Given>
  R call(Given&&... given) {
    if constexpr (sizeof...(Given) == sizeof...(A)) {
      return forward(std::forward<Given>(given)...);
    } else {
      static_assert(sizeof...(Given) < sizeof...(A), "tensortap::Tapped<M>: too many arguments for M::forward");
      std::vector<torch::nn::AnyValue> values;
      values.reserve(sizeof...(A));
      push_values(values, std::make_index_sequence<sizeof...(Given)>{}, std::forward<Given>(given)...);
      values = this->_forward_populate_default_args(std::move(values));
      return call_values(values, std::make_index_sequence<sizeof...(A)>{});
    }
  }

  /// The module as an `Impl`.
  Impl& inner() { return this->impl(); }
  const Impl& inner() const { return this->impl(); }

  /// A deep copy with the same values, a `TappedImpl` not bound to any
  /// recorder: in a cloned `Sequential` or a cloned parent too.
  std::shared_ptr<torch::nn::Module> clone(const c10::optional<torch::Device>& device = c10::nullopt) const override {
    return detail::TappedCalls<Impl>::copy_of(static_cast<const detail::TappedCalls<Impl>&>(*this),
                                              this->plain_clone(device));
  }

 protected:
  // Sequential's AnyModule asks about defaulted arguments through these.
  template <typename ModuleType, typename... ArgumentTypes>
  friend struct torch::nn::AnyModuleHolder;

 private:
  // Only TappedCalls<Impl> is ever built (the holder's operator-> relies on
  // it): the constructors are its alone, not a subclass's.
  friend class detail::TappedCalls<Impl>;
  template <class... Args>
  explicit TappedImpl(Args&&... args) : Base(std::forward<Args>(args)...) {}
  TappedImpl(const TappedImpl&) = default;

  using Arguments = std::tuple<std::decay_t<A>...>;
  template <std::size_t... I, class... Given>
  static void push_values(std::vector<torch::nn::AnyValue>& values, std::index_sequence<I...>, Given&&... given) {
    (values.emplace_back(std::tuple_element_t<I, Arguments>(std::forward<Given>(given))), ...);
  }
  template <std::size_t... I>
  R call_values(std::vector<torch::nn::AnyValue>& values, std::index_sequence<I...>) {
    return forward(values[I].template get<std::tuple_element_t<I, Arguments>>()...);
  }

  template <class T>
  T tap_result(T out, const std::string& suffix) {
    if constexpr (std::is_same_v<std::decay_t<T>, torch::Tensor>) {
      return tap_output(std::move(out), this->is_training(), suffix);
    } else {
      return tap_tuple(std::move(out), suffix, std::make_index_sequence<std::tuple_size_v<std::decay_t<T>>>{});
    }
  }
  template <class T, std::size_t... I>
  T tap_tuple(T out, const std::string& suffix, std::index_sequence<I...>) {
    return T{tap_result(std::move(std::get<I>(out)), suffix + "." + std::to_string(I))...};
  }
};


/// The holder of a tapped module: `tensortap::Tapped<torch::nn::Linear>` is
/// used like `torch::nn::Linear`, and its output is captured under its path.
///
/// Example:
/// ```
/// struct NetImpl : torch::nn::Module {
///   tensortap::Tapped<torch::nn::Linear> fc1{nullptr};   // captured as "fc1"
///   NetImpl() { fc1 = register_module("fc1", tensortap::Tapped<torch::nn::Linear>(784, 128)); }
///   torch::Tensor forward(torch::Tensor x) { return fc1(x); }
/// };
/// ```
template <class Holder>
class Tapped : public torch::nn::ModuleHolder<TappedImpl<typename Holder::ContainedType>> {
  using Impl = typename Holder::ContainedType;
  using Contained = TappedImpl<Impl>;
  using Calls = detail::TappedCalls<Impl>;
  using Base = torch::nn::ModuleHolder<Contained>;

 public:
  /// A module built with `Impl`'s default constructor.
  Tapped() : Base(make()) {}
  /// An empty holder, to assign later.
  Tapped(std::nullptr_t) : Base(nullptr) {}
  /// A module already built (what `register_module` returns).
  Tapped(std::shared_ptr<Contained> module) : Base(std::move(module)) {}
  /// A module built from `Impl`'s constructor arguments.
  template <class First, class... Rest,
            class = std::enable_if_t<!std::is_same_v<std::decay_t<First>, std::nullptr_t> &&
                                     !std::is_convertible_v<First&&, std::shared_ptr<Contained>> &&
                                     !std::is_base_of_v<Base, std::decay_t<First>>>>
  explicit Tapped(First&& first, Rest&&... rest)
      : Base(make(std::forward<First>(first), std::forward<Rest>(rest)...)) {}

  /// The module, with `forward()` callable as `Impl`'s is, defaulted
  /// trailing arguments left out included.
  Calls* operator->() { return static_cast<Calls*>(this->get()); }
  const Calls* operator->() const { return static_cast<const Calls*>(this->get()); }

  /// Calls `forward()`, defaulted trailing arguments included, like the
  /// plain module's holder.
  template <class... Args>
  decltype(auto) operator()(Args&&... args) {
    return this->get()->call(std::forward<Args>(args)...);
  }
  // (operator-> may cast: every TappedImpl is a TappedCalls, whose
  // constructors are the only ones that call TappedImpl's.)

 private:
  // As the Contained pointer: ModuleHolder's constructor from arguments
  // would take any other pointer as an argument for a new Contained.
  template <class... Args>
  static std::shared_ptr<Contained> make(Args&&... args) {
    return std::make_shared<Calls>(std::forward<Args>(args)...);
  }
};

/// Makes the children of `seq` tap points without changing its structure or
/// its parameter names: every child, or those whose path (`<seq path>.<i>`,
/// e.g. `encoder.1`) matches `pattern`, an ECMAScript regex searched in the
/// path, once `watch()` binds them. `watch()` does this itself for every
/// Sequential in the tree when `Options::tap_sequential` is set. The
/// children must take and return one tensor (Linear, Conv, ReLU, ...).
/// Calling it again is harmless. Afterwards `seq[i]` and `seq->ptr<T>(i)`
/// give the tap wrapper; reach the layer itself through
/// `seq->named_children()` or the module tree, which are unchanged.
///
/// Example:
/// ```
/// torch::nn::Sequential mlp(torch::nn::Linear(784, 128), torch::nn::ReLU(), torch::nn::Linear(128, 10));
/// tensortap::tap_sequential(*mlp);   // activations "0", "1", "2"
/// auto rec = tensortap::watch(*mlp, tensortap::Options("runs/seq"));
/// ```
void tap_sequential(torch::nn::SequentialImpl& seq);

}  // namespace tensortap

// TappedImpl<M>'s one subclass, which the holder above names: defined
// once TappedImpl is complete.
#include <tensortap/detail/tapped_calls.h>
