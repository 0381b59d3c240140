#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <torch/nn/modules/container/any.h>

#include <tensortap/tap.h>

#include "sdk/src/front/front_end.h"

namespace tensortap::detail {

/// What a bound tap point needs: the recorder's front end and the point's
/// name. A step scope's (TorchScript) also has `open_step`: its ops are
/// recorded only while it holds the current step (until backward begins).
struct TapBinding {
  std::shared_ptr<FrontEnd> front;
  std::string name;
  const std::atomic<std::int64_t>* open_step = nullptr;
};

/// The recorders a tap point feeds (see TapPoint::bindings_).
struct TapBindings {
  std::vector<std::shared_ptr<TapBinding>> items;
};

/// watch()'s way into a tap point's bindings.
class TapPointAccess {
 public:
  /// Whether `point` feeds `front` already.
  static bool bound_to(const TapPoint& point, const FrontEnd& front);
  /// Makes `point` feed `binding` too.
  static void bind(TapPoint& point, std::shared_ptr<TapBinding> binding);
  /// Stops `point` feeding `binding`; frees replaced lists no forward reads.
  static void unbind(TapPoint& point, const TapBinding* binding) noexcept;
};

/// The part of `TapPoint::tap_output` that runs on a step that captures.
at::Tensor tap_capture(const TapBinding& binding, at::Tensor out, const std::string& suffix);

/// What a module's output is, by its type: one of LibTorch's activation
/// modules (a `Tapped<M>` of one derives from it), or `None`.
Nonlinearity module_nonlinearity(const torch::nn::Module& m);
/// run.json's word for `n` ("relu", "tanh", ...; "" for `None`).
const char* nonlinearity_word(Nonlinearity n);

/// `inner`, run through a tap point: what `tap_sequential()` puts in a
/// Sequential's list of modules in place of a child. `inner` if it is one.
torch::nn::AnyModule make_sequential_tap(torch::nn::AnyModule inner);

/// Op-level capture (`Options::capture_ops`): registers ATen's
/// RecordFunction callback while at least one recorder wants it.
void op_capture_acquire();
void op_capture_release();

/// Enters and leaves the scope of a tap point on this thread; ops that run
/// inside are recorded as `<point name>/<op name>` for each of its bound
/// recorders that captures ops. `bindings` stays alive until the pop.
void op_scope_push(const TapBindings* bindings);
void op_scope_pop();

/// The scope of a step on this thread (TorchScript: every top-level op the
/// thread runs, named `<op>` or `<name>/<op>`), where no tap point's scope
/// is open; replaces this thread's last, null clears it. Kept by a weak
/// reference: a scope whose watcher is gone records nothing.
void op_step_scope(const std::shared_ptr<const TapBindings>& bindings);

/// While alive, ATen ops on this thread are tensortap's own (copies into
/// staging, the gradient view): op capture ignores them.
class OpQuiet {
 public:
  OpQuiet();
  ~OpQuiet();
  OpQuiet(const OpQuiet&) = delete;
  OpQuiet& operator=(const OpQuiet&) = delete;

 private:
  bool was_;
};

}  // namespace tensortap::detail
