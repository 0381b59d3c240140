#include "hooks/src/backward.h"

#include <algorithm>
#include <mutex>
#include <vector>

#include <ATen/record_function.h>
#include <c10/util/SmallVector.h>

namespace tensortap::detail {
namespace {

struct Listeners {
  std::mutex mu;
  std::vector<std::weak_ptr<BackwardListener>> items;
  at::CallbackHandle handle = 0;
};

// Leaked, never destroyed: a recorder held in a static lets go of its
// listeners when it closes at exit (a static destroyed first would crash it).
Listeners& listeners() {
  static Listeners* const l = new Listeners;
  return *l;
}

std::unique_ptr<at::ObserverContext> on_node(const at::RecordFunction&) {
  Listeners& l = listeners();
  // Copied out, so that a listener is never called under the lock (it may
  // take its own) and a close() meanwhile does not wait on a backward pass.
  // Inline: a backward pass runs this once a node, and allocates nothing.
  c10::SmallVector<std::shared_ptr<BackwardListener>, 4> alive;
  {
    std::lock_guard<std::mutex> lock(l.mu);
    for (const auto& w : l.items)
      if (auto s = w.lock()) alive.push_back(std::move(s));
  }
  for (const auto& s : alive) s->backward_node();
  return nullptr;
}

}  // namespace

void backward_listen(const std::shared_ptr<BackwardListener>& listener) {
  Listeners& l = listeners();
  std::lock_guard<std::mutex> lock(l.mu);
  if (l.items.empty())
    l.handle = at::addGlobalCallback(at::RecordFunctionCallback(on_node).scopes({at::RecordScope::BACKWARD_FUNCTION}));
  l.items.push_back(listener);
}

void backward_unlisten(const BackwardListener* listener) noexcept {
  Listeners& l = listeners();
  std::lock_guard<std::mutex> lock(l.mu);
  const auto gone = std::remove_if(l.items.begin(), l.items.end(), [&](const std::weak_ptr<BackwardListener>& w) {
    const auto s = w.lock();
    return !s || s.get() == listener;
  });
  if (gone == l.items.end()) return;
  l.items.erase(gone, l.items.end());
  if (l.items.empty()) at::removeCallback(l.handle);
}

}  // namespace tensortap::detail
