#pragma once

#include <chrono>
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

namespace tensortap::detail {

/// The training threads waiting inside tensortap now: for staging room
/// under Overflow::Block, in flush() or in close(). The stall watchdog names
/// them, since a job that hangs there hangs on tensortap, not on its own
/// work. Each thread registers on its own slow path (a Scope), never on the
/// hot path: tracking "inside a capture or a hook" would cost every capture
/// a store.
class Waits {
 public:
  /// While it lives, the calling thread waits at `where` (a literal:
  /// "flush()"). Never throws: a wait it cannot register goes unnamed.
  class Scope {
   public:
    Scope(Waits& waits, const char* where) noexcept;
    ~Scope();
    Scope(const Scope&) = delete;
    Scope& operator=(const Scope&) = delete;

   private:
    Waits& waits_;
    std::uint64_t id_ = 0;
  };

  /// "thread 4242 in flush() for 12.5 s", one for each wait at `now`,
  /// longest first.
  std::vector<std::string> describe(std::chrono::steady_clock::time_point now) const;

 private:
  struct Entry {
    std::uint64_t id;
    long thread;
    const char* where;
    std::chrono::steady_clock::time_point since;
  };
  mutable std::mutex mu_;
  std::vector<Entry> entries_;
  std::uint64_t next_id_ = 0;
};

}  // namespace tensortap::detail
