#pragma once

// The CUDA engine's arena allocator. It needs no CUDA: it hands out offsets
// into a ring of bytes, whatever memory the ring stands for, so it is part
// of every build and the CPU test suite checks it (tests/unit/test_ring.cpp).

#include <cstddef>
#include <cstdint>
#include <deque>
#include <optional>

namespace tensortap::detail {

/// Regions of a ring of `capacity()` bytes, taken at the back in order and
/// freed in any order. Room is reclaimed from the front only, as in any
/// ring: a freed region's bytes are reused once every region taken before
/// it is freed too. That keeps the live bytes one span (two once wrapped),
/// so placing a region costs a comparison, not a search.
///
/// Not thread safe: the engine holds its lock around every call.
class RingAllocator {
 public:
  /// A region taken: `offset` in the ring, and the id `free()` takes.
  /// Ids count up from 1, so 0 can mean "no region".
  struct Region {
    std::uint64_t id = 0;
    std::size_t offset = 0;
  };

  explicit RingAllocator(std::size_t capacity = 0) : capacity_(capacity) {}

  std::size_t capacity() const { return capacity_; }

  /// Takes `size` bytes (more than 0), right after the newest region or,
  /// when the end of the ring is in the way, at its start. Returns nullopt
  /// when they do not fit now (or ever: `size > capacity()`). A region is
  /// never split across the end of the ring.
  std::optional<Region> allocate(std::size_t size);

  /// Gives back the region `id` (taken, and not freed yet).
  void free(std::uint64_t id);

 private:
  struct Slot {
    std::size_t offset = 0;
    std::size_t size = 0;
    bool freed = false;
  };
  // Where `size` bytes would go, if there is room.
  std::optional<std::size_t> place(std::size_t size) const;

  std::size_t capacity_ = 0;
  // Regions not reclaimed yet, in allocation order (freed ones stay while an
  // older one is live); the id of regions_.front() is first_id_.
  std::deque<Slot> regions_;
  std::uint64_t first_id_ = 1;
};

}  // namespace tensortap::detail
