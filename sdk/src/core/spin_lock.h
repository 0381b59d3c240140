#pragma once

#include <atomic>
#include <thread>

namespace tensortap::detail {

/// A lock for sections of a few hundred instructions taken on every
/// capture (the name table's and staging's): one atomic exchange to take, one store to
/// give back, where a pthread mutex costs two atomic operations and about
/// a hundred instructions. A waiter spins briefly, then yields its core,
/// so a holder that was preempted gets to finish. Not for sections that
/// wait or do I/O: use std::mutex there.
class SpinLock {
 public:
  void lock() noexcept {
    for (int spins = 0; locked_.exchange(true, std::memory_order_acquire);) {
      // Wait until it looks free before trying again: reading does not take
      // the cache line from the holder's core.
      while (locked_.load(std::memory_order_relaxed))
        if (++spins > 64) std::this_thread::yield();
    }
  }
  bool try_lock() noexcept { return !locked_.exchange(true, std::memory_order_acquire); }
  void unlock() noexcept { locked_.store(false, std::memory_order_release); }

 private:
  std::atomic<bool> locked_{false};
};

}  // namespace tensortap::detail
