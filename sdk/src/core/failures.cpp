#include "sdk/src/core/failures.h"

#include <cstdio>

#include <fmt/format.h>

namespace tensortap::detail {

void Failures::add(const RecordDesc* record, const std::string& what, std::int64_t lost) noexcept {
  try {
    lost_.fetch_add(lost, std::memory_order_relaxed);
    any_.store(true, std::memory_order_release);
    std::string msg = record == nullptr ? what
                                        : fmt::format("{} (record '{}', kind {}, step {})", what, record->name,
                                                      kind_name(record->kind), record->step);
    std::lock_guard<std::mutex> lock(mu_);
    if (first_.empty()) {
      first_ = std::move(msg);
      std::fprintf(stderr, "tensortap: error: %s (later errors are counted, not printed)\n", first_.c_str());
    }
  } catch (...) {
    // Out of memory while reporting: the count above still says it failed.
  }
}

std::string Failures::first() const {
  std::lock_guard<std::mutex> lock(mu_);
  return first_;
}

std::string Failures::current() {
  try {
    throw;
  } catch (const std::exception& e) {
    return e.what();
  } catch (...) {
    // HDF5's C++ exceptions, among others, are not std::exceptions.
    return "an exception that is not a std::exception";
  }
}

}  // namespace tensortap::detail
