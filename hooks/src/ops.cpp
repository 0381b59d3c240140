// Op-level capture: ATen's RecordFunction callbacks record the outputs of
// the top-level ops run inside a tap point's scope (a Tapped<M> forward, a
// tapped Sequential child), named `<tap point>/<op>`, and, for a watched
// TorchScript module (no tap point reaches inside one), those its step's
// thread runs from step() to the step's first backward, named `<op>`.
#include <mutex>
#include <vector>

#include <ATen/record_function.h>

#include "hooks/src/binding.h"

namespace tensortap::detail {
namespace {

struct ThreadState {
  // Innermost last. The lists outlive the scopes: an OpScope keeps its
  // tap point from freeing them.
  std::vector<const TapBindings*> scopes;
  // RecordFunction depth inside the innermost scope: only depth-1 ops (those
  // the module's forward called itself) are recorded, not their internals.
  int depth = 0;
  // Set while recording: our own copies run ATen ops too.
  bool busy = false;
  // The step scope (op_step_scope), where no tap point's is open, and the
  // RecordFunction depth inside it.
  std::weak_ptr<const TapBindings> step_scope;
  int step_depth = 0;
};

thread_local ThreadState t_state;

std::unique_ptr<at::ObserverContext> on_start(const at::RecordFunction&) {
  ThreadState& st = t_state;
  if (st.busy) return nullptr;
  if (!st.scopes.empty())
    ++st.depth;
  else if (!st.step_scope.expired())
    ++st.step_depth;
  return nullptr;
}

void on_end(const at::RecordFunction& fn, at::ObserverContext*) {
  ThreadState& st = t_state;
  if (st.busy) return;
  std::shared_ptr<const TapBindings> step_scope;
  const TapBindings* scope = nullptr;
  if (!st.scopes.empty()) {
    if (st.depth-- != 1) return;
    scope = st.scopes.back();
  } else {
    step_scope = st.step_scope.lock();
    if (!step_scope || st.step_depth-- != 1) return;
    scope = step_scope.get();
  }
  st.busy = true;
  for (const auto& bp : scope->items) {
    const TapBinding& b = *bp;
    if (!b.front->options().capture_ops() || !b.front->active(Kind::Activation)) continue;
    if (b.open_step != nullptr && b.open_step->load(std::memory_order_relaxed) != b.front->current_step()) continue;
    try {
      const std::string name = b.name.empty() ? std::string(fn.name()) : b.name + "/" + fn.name();
      for (const c10::IValue& out : fn.outputs())
        if (out.isTensor() && out.toTensor().defined())
          b.front->record(Kind::Activation, name, out.toTensor(), b.front->current_step());
    } catch (...) {
      // An end callback must not throw through ATen: the op already ran.
      b.front->hook_failed(std::current_exception());
    }
  }
  st.busy = false;
}

// Leaked, never destroyed: a recorder held in a static lets go of op
// capture when it closes at exit (a static destroyed first would crash it).
std::mutex& ops_mutex() {
  static std::mutex* const mu = new std::mutex;
  return *mu;
}
int g_users = 0;
at::CallbackHandle g_handle = 0;

}  // namespace

void op_capture_acquire() {
  std::lock_guard<std::mutex> lock(ops_mutex());
  if (g_users++ == 0)
    g_handle = at::addGlobalCallback(
        at::RecordFunctionCallback(on_start, on_end).needsOutputs(true).scopes({at::RecordScope::FUNCTION}));
}

void op_capture_release() {
  std::lock_guard<std::mutex> lock(ops_mutex());
  if (--g_users == 0) at::removeCallback(g_handle);
}

OpQuiet::OpQuiet() : was_(t_state.busy) { t_state.busy = true; }

OpQuiet::~OpQuiet() { t_state.busy = was_; }

void op_scope_push(const TapBindings* bindings) {
  t_state.scopes.push_back(bindings);
  t_state.depth = 0;
}

void op_scope_pop() {
  t_state.scopes.pop_back();
  t_state.depth = 0;
}

void op_step_scope(const std::shared_ptr<const TapBindings>& bindings) {
  t_state.step_scope = bindings;
  t_state.step_depth = 0;
}

}  // namespace tensortap::detail
