#pragma once

#include <atomic>
#include <memory>
#include <mutex>
#include <ostream>
#include <vector>

#include <torch/nn/cloneable.h>
#include <torch/nn/pimpl.h>

namespace tensortap {

namespace detail {
struct TapBinding;
}  // namespace detail

/// An identity module that captures what flows through it (kind
/// `activation`) and, through a hook on its output, the gradient that flows
/// back (kind `activation_grad`), under its path in the module tree.
///
/// LibTorch has no forward hooks, so a Tap marks the place instead: put one
/// where you want to see the activations. `tensortap::watch()` finds every
/// Tap in the module tree and binds it to the recorder. An unbound Tap, or a
/// Tap on a step that is not sampled, returns its input at the cost of one
/// atomic load.
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
class TapImpl : public torch::nn::Cloneable<TapImpl> {
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

  /// Internal, used by `watch()`: routes captures to a recorder.
  void bind(std::shared_ptr<detail::TapBinding> binding);
  /// Internal: stops routing to `binding` if it is the current one.
  void unbind(const detail::TapBinding* binding) noexcept;

 private:
  // Read on every forward without a lock. Bindings are never freed while
  // the Tap lives (`bindings_` keeps them), so a forward racing with
  // unbind() still reads a live one.
  std::atomic<detail::TapBinding*> binding_{nullptr};
  std::mutex bindings_mu_;
  std::vector<std::shared_ptr<detail::TapBinding>> bindings_;
};

/// A `ModuleHolder` for `TapImpl`, like `torch::nn::Linear` for `LinearImpl`.
TORCH_MODULE(Tap);

}  // namespace tensortap
