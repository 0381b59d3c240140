#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "writers/src/file.h"

namespace tensortap::detail {

/// Files of a run directory that each hold whole steps and are complete
/// (statistics segments, rolled TensorBoard event files; docs/design.md, "Leaving it on"):
/// under Budget::KeepLatest, a give-up of the steps below k deletes every
/// such file whose steps are all below k. Writer thread only.
class StepFiles {
 public:
  struct Entry {
    std::string name;  // in the run directory
    std::int64_t min_step = 0, max_step = 0;
    std::uint64_t bytes = 0;
    std::int64_t items = 0;  // what it holds (a statistics segment's rows)
  };
  void add(Entry entry) { files_.push_back(std::move(entry)); }
  /// The bytes a give-up below `below` would free.
  std::uint64_t bytes_below(std::int64_t below) const;
  /// Deletes the files whose steps are all below `below`; the bytes freed.
  /// A file that cannot be deleted is forgotten (hidden all the same); the
  /// first error is thrown once the rest went.
  std::uint64_t give_up(const Dir& dir, std::int64_t below);
  /// Files deleted so far, and their items.
  std::int64_t given_up() const { return given_up_; }
  std::int64_t items_given_up() const { return items_given_up_; }

 private:
  std::vector<Entry> files_;
  std::int64_t given_up_ = 0, items_given_up_ = 0;
};

}  // namespace tensortap::detail
