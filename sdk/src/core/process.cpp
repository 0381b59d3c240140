#include "sdk/src/core/process.h"

#include <pthread.h>

#include <mutex>

namespace tensortap::detail {

std::atomic<std::uint64_t> g_fork_generation{0};

namespace {

// Async-signal-safe, as an atfork child handler must be: one atomic add.
void on_fork_child() { g_fork_generation.fetch_add(1, std::memory_order_relaxed); }

}  // namespace

std::uint64_t fork_generation() noexcept {
  static std::once_flag registered;
  std::call_once(registered, [] { pthread_atfork(nullptr, nullptr, on_fork_child); });
  return g_fork_generation.load(std::memory_order_relaxed);
}

}  // namespace tensortap::detail
