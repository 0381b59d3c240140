#pragma once

#include <atomic>
#include <memory>
#include <mutex>
#include <ostream>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include <torch/nn/cloneable.h>
#include <torch/nn/module.h>
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
  /// unless its options say so, only in training mode). Returns `out`, or a
  /// view of it that carries the gradient hooks.
  torch::Tensor tap_output(torch::Tensor out, bool training) const;

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

/// A module of type `Impl` (e.g. `torch::nn::LinearImpl`) whose output is a
/// tap point. It is an `Impl`: same constructors, parameters and parameter
/// names, so it replaces the plain module without touching `forward()` or a
/// checkpoint. Its `forward()` has `Impl::forward`'s parameters (default
/// arguments must be passed). Outputs that are not a single tensor pass
/// through uncaptured. A `clone()` is a plain `Impl`.
template <class Impl, class Forward = decltype(&Impl::forward)>
class TappedImpl;

template <class Impl, class R, class C, class... A>
class TappedImpl<Impl, R (C::*)(A...)> : public Impl, public TapPoint {
 public:
  using Impl::Impl;

  R forward(A... args) {
    OpScope scope(*this);
    if constexpr (std::is_same_v<std::decay_t<R>, torch::Tensor>)
      return tap_output(Impl::forward(std::forward<A>(args)...), this->is_training());
    else
      return Impl::forward(std::forward<A>(args)...);
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
 public:
  using torch::nn::ModuleHolder<TappedImpl<typename Holder::ContainedType>>::ModuleHolder;
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
