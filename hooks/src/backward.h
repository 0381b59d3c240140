#pragma once

// When a backward pass begins: LibTorch has no such hook, but its autograd
// engine runs every node under a RecordFunction of scope BACKWARD_FUNCTION,
// and the first of a pass runs before any parameter's gradient is
// accumulated. Two things need that moment: a layer unfrozen during a step
// is hooked then, in time for its gradient of that very step (params.cpp),
// and TorchScript op capture stops there, so that backward's and the
// optimizer's ops are not taken for the model's (jit.cpp).

#include <memory>

namespace tensortap::detail {

/// Told, on the engine's thread, when a node of a backward pass is about to
/// run: it must be cheap in the common case (a relaxed load), must not
/// throw, and must not run ATen ops.
class BackwardListener {
 public:
  virtual ~BackwardListener() = default;
  virtual void backward_node() noexcept = 0;
};

/// Adds `listener` (kept by a weak reference): while any is registered,
/// ATen's RecordFunction callback for BACKWARD_FUNCTION is on.
void backward_listen(const std::shared_ptr<BackwardListener>& listener);
/// Removes it; the callback goes off with the last listener.
void backward_unlisten(const BackwardListener* listener) noexcept;

}  // namespace tensortap::detail
