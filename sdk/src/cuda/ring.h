#pragma once

// The CUDA engine's arena allocator. It needs no CUDA: it hands out offsets
// into a ring of bytes, whatever memory the ring stands for, so it is part
// of every build and the CPU test suite checks it (tests/unit/test_ring.cpp).

#include <cstddef>
#include <cstdint>
#include <optional>
#include <vector>

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

  // Regions not reclaimed yet, in allocation order (freed ones stay while an
  // older one is live): a circular buffer that grows by doubling and never
  // shrinks, so a steady state of regions allocates nothing (a deque took a
  // block every 21 regions, in the fake runtime's counts).
  class Slots {
   public:
    bool empty() const { return size_ == 0; }
    std::size_t size() const { return size_; }
    Slot& operator[](std::size_t i) { return slots_[(head_ + i) & (slots_.size() - 1)]; }
    const Slot& front() const { return slots_[head_]; }
    const Slot& back() const { return slots_[(head_ + size_ - 1) & (slots_.size() - 1)]; }
    void push_back(const Slot& s) {
      if (size_ == slots_.size()) grow();
      slots_[(head_ + size_) & (slots_.size() - 1)] = s;
      ++size_;
    }
    void pop_front() {
      head_ = (head_ + 1) & (slots_.size() - 1);
      --size_;
    }

   private:
    void grow() {
      std::vector<Slot> bigger(slots_.empty() ? 64 : 2 * slots_.size());
      for (std::size_t i = 0; i < size_; ++i) bigger[i] = (*this)[i];
      slots_.swap(bigger);
      head_ = 0;
    }
    std::vector<Slot> slots_;  // a power of two long
    std::size_t head_ = 0, size_ = 0;
  };

  std::size_t capacity_ = 0;
  // The id of regions_.front() is first_id_.
  Slots regions_;
  std::uint64_t first_id_ = 1;
};

}  // namespace tensortap::detail
