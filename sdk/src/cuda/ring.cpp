#include "sdk/src/cuda/ring.h"

namespace tensortap::detail {

std::optional<std::size_t> RingAllocator::place(std::size_t size) const {
  if (regions_.empty()) return size <= capacity_ ? std::optional<std::size_t>(0) : std::nullopt;
  const Slot& front = regions_.front();
  const Slot& back = regions_.back();
  const std::size_t end = back.offset + back.size;
  if (back.offset >= front.offset) {
    // Live bytes are [front, end): room after them, or before them.
    if (end + size <= capacity_) return end;
    if (size <= front.offset) return 0;
    return std::nullopt;
  }
  // Wrapped: live bytes are [front, capacity) and [0, end).
  if (end + size <= front.offset) return end;
  return std::nullopt;
}

std::optional<RingAllocator::Region> RingAllocator::allocate(std::size_t size) {
  // An empty region would sit where the next one starts, and the ring could
  // no longer tell wrapped from not.
  if (size == 0) return std::nullopt;
  const std::optional<std::size_t> offset = place(size);
  if (!offset) return std::nullopt;
  regions_.push_back(Slot{*offset, size, false});
  return Region{first_id_ + regions_.size() - 1, *offset};
}

void RingAllocator::free(std::uint64_t id) {
  regions_[static_cast<std::size_t>(id - first_id_)].freed = true;
  while (!regions_.empty() && regions_.front().freed) {
    regions_.pop_front();
    ++first_id_;
  }
}

}  // namespace tensortap::detail
