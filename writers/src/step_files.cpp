#include "writers/src/step_files.h"

#include <exception>

namespace tensortap::detail {

std::uint64_t StepFiles::bytes_below(std::int64_t below) const {
  std::uint64_t bytes = 0;
  for (const Entry& e : files_)
    if (e.max_step < below) bytes += e.bytes;
  return bytes;
}

std::uint64_t StepFiles::give_up(const Dir& dir, std::int64_t below) {
  std::uint64_t freed = 0;
  std::exception_ptr first;
  for (auto it = files_.begin(); it != files_.end();) {
    if (it->max_step >= below) {
      ++it;
      continue;
    }
    try {
      dir.unlink(it->name);
      freed += it->bytes;
      ++given_up_;
      items_given_up_ += it->items;
    } catch (...) {
      if (!first) first = std::current_exception();
    }
    it = files_.erase(it);
  }
  if (first) std::rethrow_exception(first);
  return freed;
}

}  // namespace tensortap::detail
