#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <tensortap/options.h>

#include "sdk/src/core/pattern.h"
#include "writers/src/kind_set_access.h"

namespace tensortap::detail {

/// What `tensortap ctl` changed of the options' cadence (capture, every,
/// pause): each field from a step on. Immutable once published.
struct Steering {
  /// capture --steps: every step of [window_lo, window_hi] in full, these
  /// kinds, whatever the cadence or a pause say.
  std::int64_t window_lo = -1, window_hi = -1;
  std::uint64_t window_kinds = 0;
  /// Its include ("": the recorder's own): a capture that extends a
  /// running window joins its include to the running one's. Compiled on
  /// the training thread, where the answer is made, and read there (and by
  /// a late record's hook on another thread) when a record of the window
  /// is decided: a window is kept whole, whenever the writer thread hears
  /// of it.
  std::string window_include;
  std::shared_ptr<const Pattern> window_pattern;
  /// every N from `every_from` (-1: the options' cadence; 0: none).
  std::int64_t every = -1, every_from = 0;
  /// pause: no full tensors from this step (-1: not paused).
  std::int64_t paused_from = -1;
  /// Set by `Sampling::steer`: the first step this version decides, and the
  /// one before it, which still decides the earlier steps (a gradient of
  /// step s is committed in step(s + 1), after a request taken there).
  std::int64_t from = 0;
  const Steering* prev = nullptr;
};

/// What is captured: which steps and kinds are sampled (full tensors, or
/// their statistics), and which names are selected. The current step and
/// its plan live in one atomic word, so a hook on another thread never
/// pairs one step's number with another's plan, and the hot path's test is
/// one relaxed load.
class Sampling {
 public:
  /// Compiles the name patterns; throws `Error` for a bad one.
  explicit Sampling(const Options& options);

  /// Whether `kind` is captured now, full or as statistics. False before
  /// the first step, on steps not sampled, and once stopped.
  bool active(Kind kind) const noexcept {
    const std::uint64_t bit = KindSetAccess::bit(kind);
    return (state_.load(std::memory_order_relaxed) & (bit | bit << kStatsShift)) != 0;
  }
  /// The current step, -1 before the first.
  std::int64_t current_step() const noexcept {
    return static_cast<std::int64_t>(state_.load(std::memory_order_relaxed) >> kStepShift) - 1;
  }
  /// Whether `name` passes the include and exclude patterns.
  bool selected(const std::string& name) const;
  /// Whether the Sequential child at `path` is to be made a tap point.
  bool taps_sequential_child(const std::string& path) const {
    return !tap_sequential_.empty() && tap_sequential_.search(path);
  }

  /// What a record of `step` gets: full-tensor kind bits in the low byte,
  /// statistics bits in the next (see `full()` and `stats()`). A late
  /// record (gradients commit when the next step begins) gets its own
  /// step's plan. Nothing unless `capturing`; no full tensors when
  /// `full_halted`.
  /// Inline: every sampled record asks it.
  std::uint64_t plan(std::int64_t step, bool capturing, bool full_halted) const {
    const std::uint64_t state = state_.load(std::memory_order_relaxed);
    std::uint64_t bits = static_cast<std::int64_t>(state >> kStepShift) - 1 == step ? state & kPlanMask
                                                                                     : other_plan(step, capturing);
    if (full_halted) bits &= ~kFullMask;
    return bits;
  }
  static bool full(std::uint64_t plan, Kind kind) { return (plan & KindSetAccess::bit(kind)) != 0; }
  /// Whether the step is in a `ctl capture` window: its full records are
  /// stored, not held by a flight recorder.
  static bool in_window(std::uint64_t plan) { return (plan & kWindowBit) != 0; }
  /// Whether `step`'s window's own include, if it has one, finds `name`
  /// (true outside a window): asked only of a record `in_window`.
  bool window_selects(std::int64_t step, std::string_view name) const;
  static bool stats(std::uint64_t plan, Kind kind) { return (plan >> kStatsShift & KindSetAccess::bit(kind)) != 0; }

  /// Makes `step` current with its plan.
  void begin(std::int64_t step, bool capturing, bool full_halted);
  /// Captures nothing more, keeping the current step.
  void stop() { state_.fetch_and(~kPlanMask, std::memory_order_relaxed); }

  /// Training thread, in step(from) before `begin()`: the cadence `ctl`
  /// asked for from step `from` on. Versions are kept to the end, so a late
  /// record's plan on another thread may read the one it found, and a step
  /// before `from` is decided by the version it ran under.
  void steer(Steering s, std::int64_t from);
  /// The last `steer()`'s, or null.
  const Steering* steering() const { return steering_.load(std::memory_order_acquire); }

 private:
  // The plan of a step that is not the current one (a late record's).
  std::uint64_t other_plan(std::int64_t step, bool capturing) const;
  // The kinds `step` samples, and those whose statistics it takes.
  std::uint64_t full_bits(std::int64_t step) const;
  std::uint64_t stats_bits(std::int64_t step) const;
  // The version of the steering that decides `step`, or null.
  const Steering* steering_of(std::int64_t step) const {
    const Steering* c = steering();
    while (c != nullptr && step < c->from) c = c->prev;
    return c;
  }

  const Options& options_;
  // Matched without backtracking: a hostile pattern or name cannot hang or
  // overflow the stack (see Pattern).
  Pattern include_;
  Pattern exclude_;
  Pattern tap_sequential_;
  const bool has_include_;
  const bool has_exclude_;
  std::vector<std::unique_ptr<const Steering>> steerings_;
  std::atomic<const Steering*> steering_{nullptr};

  // (step + 1) << kStepShift | statistics kind bits << kStatsShift | full
  // kind bits. 0 = before the first step.
  static constexpr unsigned kStatsShift = 8;
  static constexpr unsigned kStepShift = 16;
  static constexpr std::uint64_t kPlanMask = (std::uint64_t{1} << kStepShift) - 1;
  static constexpr std::uint64_t kFullMask = (std::uint64_t{1} << kStatsShift) - 1;
  // Among the full bits, above every kind's: the step is a window's.
  static constexpr std::uint64_t kWindowBit = std::uint64_t{1} << 7;
  static_assert(kKindCount < 8, "a kind's full bit would be the window's");
  std::atomic<std::uint64_t> state_{0};
};

}  // namespace tensortap::detail
