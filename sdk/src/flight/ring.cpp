#include "sdk/src/flight/ring.h"

#include <algorithm>

namespace tensortap::detail {

void FlightRing::drop_oldest() {
  bytes_ -= steps_.front().bytes;
  steps_.pop_front();
}

bool FlightRing::hold(HeldRecord record) {
  const std::int64_t step = record.record.desc.step;
  const std::size_t n = record.bytes.size();
  // Records normally arrive step by step; a late one (a hook on another
  // thread) still joins its step if that is held.
  auto it =
      std::lower_bound(steps_.begin(), steps_.end(), step, [](const Step& s, std::int64_t v) { return s.step < v; });
  if (it == steps_.end() || it->step != step) {
    // Older than every held step, with the window full: outside it.
    if (it == steps_.begin() && !steps_.empty() && static_cast<std::int64_t>(steps_.size()) > k_) return false;
    Step fresh;
    fresh.step = step;
    steps_.insert(it, std::move(fresh));
  }
  it = std::lower_bound(steps_.begin(), steps_.end(), step, [](const Step& s, std::int64_t v) { return s.step < v; });
  if (it->bytes + n > budget_) {
    // It cannot fit even if every other step went: let none go for it.
    if (it->records.empty()) steps_.erase(it);
    return false;
  }
  // Keep `k` steps before the newest; the budget then lets older steps go
  // first. The record's own step is never let go for it. (Compared as
  // size - 1 > k: k + 1 overflows for k = INT64_MAX, which kept only the
  // newest step.)
  while (steps_.front().step != step &&
         (static_cast<std::int64_t>(steps_.size()) - 1 > k_ || bytes_ + n > budget_))
    drop_oldest();
  it = std::lower_bound(steps_.begin(), steps_.end(), step, [](const Step& s, std::int64_t v) { return s.step < v; });
  if (bytes_ + n > budget_) {
    // A late record whose newer steps fill the budget: they stay.
    if (it->records.empty()) steps_.erase(it);
    return false;
  }
  it->bytes += n;
  bytes_ += n;
  it->records.push_back(std::move(record));
  return true;
}

std::vector<HeldRecord> FlightRing::take(std::int64_t step) {
  std::vector<HeldRecord> out;
  std::int64_t before = 0;
  for (const Step& s : steps_) before += s.step < step;
  std::int64_t skip = std::max<std::int64_t>(0, before - k_);
  for (Step& s : steps_) {
    if (s.step < step && skip > 0) {
      --skip;
      continue;
    }
    for (HeldRecord& r : s.records) out.push_back(std::move(r));
  }
  steps_.clear();
  bytes_ = 0;
  return out;
}

std::vector<std::int64_t> FlightRing::steps() const {
  std::vector<std::int64_t> out;
  for (const Step& s : steps_) out.push_back(s.step);
  return out;
}

}  // namespace tensortap::detail
