#pragma once

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

namespace tensortap {

namespace detail {
struct TapBindings;
class TapPointAccess;
}  // namespace detail

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
///   tensortap::Tap hidden;   // captured as "hidden"
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

}  // namespace detail

/// A module of type `Impl` (e.g. `torch::nn::LinearImpl`) whose output is a
/// tap point. It wraps an `Impl` built from the same constructor arguments
/// and takes its parameters, buffers and submodules as its own, under the
/// same names: it replaces the plain module without touching `forward()`
/// or a checkpoint, and `train()`/`eval()`, `to()` and `load` reach the
/// wrapped module. `forward()` takes exactly `Impl::forward`'s arguments,
/// defaults included, also inside a `Sequential`. A tensor output is
/// captured under the module's path; a tuple's tensors (LSTM, GRU,
/// MultiheadAttention) under `<path>.0`, `<path>.1`, nested ones
/// `<path>.1.0`. A module whose `forward` returns anything else is refused
/// at compile time. `inner()` is the wrapped module; a `clone()` is a plain
/// `Impl`.
template <class Impl, class Forward = decltype(&Impl::forward)>
class TappedImpl;

template <class Impl, class R, class C, class... A>
class TappedImpl<Impl, R (C::*)(A...)> : public torch::nn::Module, public TapPoint {
  static_assert(detail::Capturable<std::decay_t<R>>::value,
                "tensortap::Tapped<M>: M::forward must return a torch::Tensor or a std::tuple of them; "
                "capture other outputs with Recorder::capture() or a tensortap::Tap after the module");

 public:
  template <class... Args, class = std::enable_if_t<std::is_constructible_v<Impl, Args&&...>>>
  explicit TappedImpl(Args&&... args) : inner_(std::make_shared<Impl>(std::forward<Args>(args)...)) {
    adopt();
  }

  R forward(A... args) {
    OpScope scope(*this);
    return tap_result(inner_->forward(std::forward<A>(args)...), "");
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
      values = _forward_populate_default_args(std::move(values));
      return call_values(values, std::make_index_sequence<sizeof...(A)>{});
    }
  }

  /// The wrapped module.
  Impl& inner() { return *inner_; }
  const Impl& inner() const { return *inner_; }

  void train(bool on = true) override {
    torch::nn::Module::train(on);
    inner_->train(on);
  }
  std::shared_ptr<torch::nn::Module> clone(const c10::optional<torch::Device>& device = c10::nullopt) const override {
    return inner_->clone(device);
  }
  void pretty_print(std::ostream& stream) const override {
    stream << "tensortap::Tapped(";
    inner_->pretty_print(stream);
    stream << ")";
  }

 protected:
  // What Sequential (AnyModule) asks about defaulted forward arguments: the
  // wrapped module's answers.
  template <typename ModuleType, typename... ArgumentTypes>
  friend struct torch::nn::AnyModuleHolder;
  bool _forward_has_default_args() override {
    return (static_cast<torch::nn::Module&>(*inner_).*&detail::ModuleAccess::_forward_has_default_args)();
  }
  unsigned int _forward_num_required_args() override {
    return (static_cast<torch::nn::Module&>(*inner_).*&detail::ModuleAccess::_forward_num_required_args)();
  }
  std::vector<torch::nn::AnyValue> _forward_populate_default_args(
      std::vector<torch::nn::AnyValue>&& arguments) override {
    return (static_cast<torch::nn::Module&>(*inner_).*
            &detail::ModuleAccess::_forward_populate_default_args)(std::move(arguments));
  }

 private:
  // The wrapped module's parameters, buffers and children become this
  // module's, by name: the same tensors, so an optimizer, a checkpoint or
  // to() sees one set. Deriving from Impl instead would need symbols
  // LibTorch does not export (BatchNorm's pretty_print).
  void adopt() {
    for (const auto& p : inner_->named_parameters(/*recurse=*/false))
      register_parameter(p.key(), p.value(), p.value().requires_grad());
    for (const auto& b : inner_->named_buffers(/*recurse=*/false)) register_buffer(b.key(), b.value());
    for (const auto& c : inner_->named_children()) register_module(c.key(), c.value());
    torch::nn::Module::train(inner_->is_training());
  }

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

  std::shared_ptr<Impl> inner_;
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
 public:
  using torch::nn::ModuleHolder<TappedImpl<typename Holder::ContainedType>>::ModuleHolder;

  /// Calls `forward()`, defaulted trailing arguments included, like the
  /// plain module's holder.
  template <class... Args>
  decltype(auto) operator()(Args&&... args) {
    return this->get()->call(std::forward<Args>(args)...);
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
