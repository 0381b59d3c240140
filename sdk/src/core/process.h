#pragma once

// Two questions a recorder's public calls ask before they touch shared
// state:
//
// - Is this a fork() child of the process that made the recorder? A child
//   has the parent's memory but none of its threads: the writer and copier
//   are gone, a lock one of them held stays locked forever, and the run's
//   files are the parent's. There the recorder is inert: every call returns
//   at once, writes nothing, and it is never destroyed (destroying its
//   condition variables can wait forever for the parent's waiters).
// - Is this one of the recorder's own background threads (a Trigger::when
//   predicate runs on the writer thread)? A call that waits for those
//   threads (flush, close, a capture into full staging) would wait for
//   itself, so such calls are refused there with an Error.

#include <atomic>
#include <cstdint>

namespace tensortap::detail {

/// Incremented in every fork() child (pthread_atfork), once the first
/// recorder has registered the handler.
extern std::atomic<std::uint64_t> g_fork_generation;

/// The current generation; registers the fork handler on the first call.
std::uint64_t fork_generation() noexcept;

/// True in a fork() child of the process that was at `generation`.
inline bool forked_since(std::uint64_t generation) noexcept {
  return g_fork_generation.load(std::memory_order_relaxed) != generation;
}

/// Whether the calling thread is one of tensortap's background threads:
/// read by every step() and capture(), so inline (a thread-local load, no
/// call).
inline thread_local bool t_background_thread = false;

/// Marks the calling thread as one of tensortap's background threads.
inline void mark_background_thread() noexcept { t_background_thread = true; }
inline bool on_background_thread() noexcept { return t_background_thread; }

}  // namespace tensortap::detail
