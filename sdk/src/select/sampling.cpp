#include "sdk/src/select/sampling.h"

#include <algorithm>

namespace tensortap::detail {

Sampling::Sampling(const Options& options)
    : options_(options),
      include_(options.include(), "include"),
      exclude_(options.exclude(), "exclude"),
      tap_sequential_(options.tap_sequential(), "tap_sequential"),
      has_include_(!options.include().empty()),
      has_exclude_(!options.exclude().empty()) {}

bool Sampling::selected(const std::string& name) const {
  if (has_include_ && !include_.search(name)) return false;
  if (has_exclude_ && exclude_.search(name)) return false;
  return true;
}

void Sampling::steer(Steering s, std::int64_t from) {
  s.from = from;
  s.prev = steering();
  steerings_.push_back(std::make_unique<const Steering>(s));
  steering_.store(steerings_.back().get(), std::memory_order_release);
}

bool Sampling::window_selects(std::int64_t step, std::string_view name) const {
  const Steering* c = steering_of(step);
  return c == nullptr || step < c->window_lo || step > c->window_hi || !c->window_pattern ||
         c->window_pattern->search(name);
}

std::uint64_t Sampling::full_bits(std::int64_t step) const {
  const Options& o = options_;
  if (const Steering* c = steering_of(step)) {
    if (c->window_lo <= step && step <= c->window_hi) return c->window_kinds | kWindowBit;
    if (c->paused_from >= 0 && step >= c->paused_from) return 0;
    if (c->every >= 0 && step >= c->every_from)
      return c->every > 0 && (step - c->every_from) % c->every == 0 ? KindSetAccess::bits(o.kinds()) : 0;
  }
  if (step < o.start()) return 0;
  if (o.stop() && step >= *o.stop()) return 0;
  if (!o.steps().empty() && std::find(o.steps().begin(), o.steps().end(), step) == o.steps().end()) return 0;
  std::uint64_t bits = 0;
  for (Kind k : kAllKinds) {
    if (!o.kinds().contains(k)) continue;
    // Listed steps replace the periods, but not a kind's own 0 (off).
    const bool on = o.steps().empty() ? o.every(k) > 0 && (step - o.start()) % o.every(k) == 0 : o.every_override(k) != 0;
    if (on) bits |= KindSetAccess::bit(k);
  }
  return bits;
}

std::uint64_t Sampling::stats_bits(std::int64_t step) const {
  const Options& o = options_;
  if (o.stats_every() <= 0 || step < o.start()) return 0;
  if (o.stop() && step >= *o.stop()) return 0;
  return (step - o.start()) % o.stats_every() == 0 ? KindSetAccess::bits(o.kinds()) : 0;
}

std::uint64_t Sampling::other_plan(std::int64_t step, bool capturing) const {
  return capturing ? full_bits(step) | stats_bits(step) << kStatsShift : 0;
}

void Sampling::begin(std::int64_t step, bool capturing, bool full_halted) {
  std::uint64_t bits = 0;
  if (capturing) {
    if (!full_halted) bits = full_bits(step);
    bits |= stats_bits(step) << kStatsShift;
  }
  state_.store((static_cast<std::uint64_t>(step) + 1) << kStepShift | bits, std::memory_order_relaxed);
}

}  // namespace tensortap::detail
