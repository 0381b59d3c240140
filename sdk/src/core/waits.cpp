#include "sdk/src/core/waits.h"

#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>

#include <fmt/format.h>

namespace tensortap::detail {

Waits::Scope::Scope(Waits& waits, const char* where) noexcept : waits_(waits) {
  try {
    // The kernel's thread id: what a debugger, top -H and /proc show.
    const long thread = static_cast<long>(::syscall(SYS_gettid));
    std::lock_guard<std::mutex> lock(waits_.mu_);
    waits_.entries_.push_back(Entry{++waits_.next_id_, thread, where, std::chrono::steady_clock::now()});
    id_ = waits_.next_id_;
  } catch (...) {
    id_ = 0;
  }
}

Waits::Scope::~Scope() {
  if (id_ == 0) return;
  std::lock_guard<std::mutex> lock(waits_.mu_);
  auto& e = waits_.entries_;
  e.erase(std::remove_if(e.begin(), e.end(), [&](const Entry& x) { return x.id == id_; }), e.end());
}

std::vector<std::string> Waits::describe(std::chrono::steady_clock::time_point now) const {
  std::vector<Entry> entries;
  {
    std::lock_guard<std::mutex> lock(mu_);
    entries = entries_;
  }
  std::sort(entries.begin(), entries.end(), [](const Entry& a, const Entry& b) { return a.since < b.since; });
  std::vector<std::string> out;
  for (const Entry& e : entries)
    out.push_back(fmt::format("thread {} in {} for {:.1f} s", e.thread, e.where,
                              std::chrono::duration<double>(now - e.since).count()));
  return out;
}

}  // namespace tensortap::detail
