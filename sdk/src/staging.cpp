#include "sdk/src/staging.h"

#include <cstdlib>

#include <fmt/format.h>

#include <tensortap/error.h>
#include "writers/src/check.h"

namespace tensortap::detail {
namespace {

// Records start on 64-byte boundaries: whole cache lines for memcpy, and
// the alignment a pinned-memory DMA engine likes.
constexpr std::size_t kRecordAlign = 64;
constexpr std::size_t kPage = 4096;
// Chunks of a large record are no smaller than this (unless it is the rest),
// so a nearly full buffer is not filled with slivers.
constexpr std::size_t kMinChunk = std::size_t{64} << 10;

std::size_t align_up(std::size_t n, std::size_t a) { return (n + a - 1) / a * a; }

}  // namespace

Staging::Staging(std::size_t capacity, Overflow overflow, HostMemory memory)
    : capacity_(capacity), overflow_(overflow), memory_(memory) {}

Staging::~Staging() {
  for (int i = 0; i < 2; ++i) {
    release_memory(buffers_[i].data, held_[i]);
    release_memory(spare_[i], memory_);
  }
}

void* Staging::allocate(std::size_t bytes) const {
  if (memory_.allocate != nullptr) return memory_.allocate(bytes);
  return std::aligned_alloc(kPage, bytes);
}

void Staging::release_memory(void* data, const HostMemory& from) {
  if (data == nullptr) return;
  if (from.release != nullptr)
    from.release(data);
  else
    std::free(data);
}

std::pair<void*, HostMemory> Staging::move_to_spare(int i) {
  std::pair<void*, HostMemory> old{buffers_[i].data, held_[i]};
  buffers_[i].data = static_cast<char*>(spare_[i]);
  held_[i] = memory_;
  spare_[i] = nullptr;
  return old;
}

bool Staging::adopt(HostMemory memory) {
  if (memory.allocate == nullptr) return false;
  const std::size_t bytes = align_up(capacity_, kPage);
  void* fresh[2] = {memory.allocate(bytes), nullptr};
  if (fresh[0] != nullptr) fresh[1] = memory.allocate(bytes);
  std::pair<void*, HostMemory> old[2];
  bool adopted = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!stopping_ && fresh[0] != nullptr && fresh[1] != nullptr && spare_[0] == nullptr && spare_[1] == nullptr) {
      adopted = true;
      memory_ = memory;
      for (int i = 0; i < 2; ++i) {
        spare_[i] = fresh[i];
        fresh[i] = nullptr;
        // No slot: no reservation points into it, and the writer does not
        // hold it (it takes only a buffer with slots).
        if (buffers_[i].slots.empty()) old[i] = move_to_spare(i);
      }
    }
  }
  for (int i = 0; i < 2; ++i) {
    release_memory(fresh[i], memory);
    release_memory(old[i].first, old[i].second);
  }
  return adopted;
}

std::optional<Staging::Ticket> Staging::reserve(Slot slot, bool may_drop, std::size_t unit, bool wait) {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    // A hook that raced with close() must not queue what no writer drains.
    if (stopping_) return std::nullopt;
    Buffer& b = buffers_[fill_];
    const std::size_t offset = align_up(b.used, kRecordAlign);
    const std::size_t room = offset < capacity_ ? capacity_ - offset : 0;
    std::size_t n = slot.nbytes;
    bool fits = n <= room;
    if (unit != 0) {
      const std::size_t least = std::min(slot.nbytes, std::max(unit, std::min(capacity_, kMinChunk) / unit * unit));
      n = std::min(slot.nbytes, room / unit * unit);
      fits = n >= least && n > 0;
      slot.last = n == slot.nbytes;
    }
    if (fits) {
      if (b.data == nullptr) {
        b.data = static_cast<char*>(allocate(align_up(capacity_, kPage)));
        held_[fill_] = memory_;
        if (b.data == nullptr)
          fail(
              "cannot allocate a staging buffer of {} bytes "
              "(Options::buffer_bytes)",
              capacity_);
      }
      slot.offset = offset;
      slot.nbytes = n;
      // The slot goes in first: if that throws, nothing counts it as pending.
      b.slots.push_back(std::move(slot));
      b.used = offset + n;
      ++b.pending;
      ++reserved_;
      return Ticket{&b, b.slots.size() - 1, b.data + offset, n};
    }
    if (may_drop && overflow_ == Overflow::DropNewest) return std::nullopt;
    // No room: the writer must take this buffer now, not at the next kick().
    if (b.pending == 0) writer_cv_.notify_one();
    if (!wait) return std::nullopt;
    // The buffer holds data (an empty one has room for any slot), so the
    // writer will take it once the pending copies are committed.
    ++waiting_;
    space_cv_.wait(lock);
    --waiting_;
  }
}

void Staging::commit(const Ticket& ticket, bool ok) {
  bool wake = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    Buffer& b = *ticket.buffer;
    if (!ok) b.slots[ticket.slot].ok = false;
    // Waking the writer is a futex call, and in a VM an interrupt to the
    // other core: microseconds of the capturing thread, per record. Wake it
    // when there is enough to write or someone waits for it; kick(), once a
    // step, wakes it for the rest.
    // Once stop() has begun nothing else will: the writer drains and exits.
    wake = --b.pending == 0 && (waiting_ > 0 || stopping_ || b.used >= capacity_ / 2);
    if (!wake) unwoken_.store(true, std::memory_order_relaxed);
  }
  if (wake) writer_cv_.notify_one();
}

void Staging::kick() {
  // Most steps commit nothing: no lock for them.
  if (!unwoken_.exchange(false, std::memory_order_relaxed)) return;
  bool wake = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    const Buffer& b = buffers_[fill_];
    wake = !b.slots.empty() && b.pending == 0;
  }
  if (wake) writer_cv_.notify_one();
}

void Staging::wait_drained() {
  std::unique_lock<std::mutex> lock(mu_);
  const std::uint64_t target = reserved_;
  ++waiting_;
  if (buffers_[fill_].pending == 0) writer_cv_.notify_one();
  drained_cv_.wait(lock, [&] { return released_ >= target; });
  --waiting_;
}

Staging::Buffer* Staging::take() {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    Buffer& b = buffers_[fill_];
    if (!b.slots.empty() && b.pending == 0) {
      fill_ ^= 1;
      lock.unlock();
      space_cv_.notify_all();
      return &b;
    }
    if (stopping_ && b.slots.empty()) return nullptr;
    writer_cv_.wait(lock);
  }
}

void Staging::release(Buffer* buffer) {
  std::pair<void*, HostMemory> old;
  {
    std::lock_guard<std::mutex> lock(mu_);
    released_ += buffer->slots.size();
    buffer->slots.clear();
    buffer->used = 0;
    const int i = static_cast<int>(buffer - buffers_);
    if (spare_[i] != nullptr) old = move_to_spare(i);
  }
  release_memory(old.first, old.second);
  drained_cv_.notify_all();
}

void Staging::stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  writer_cv_.notify_one();
  space_cv_.notify_all();
}

void Staging::free_memory() {
  std::lock_guard<std::mutex> lock(mu_);
  for (int i = 0; i < 2; ++i) {
    Buffer& b = buffers_[i];
    release_memory(b.data, held_[i]);
    release_memory(spare_[i], memory_);
    b.data = nullptr;
    spare_[i] = nullptr;
    b.slots.shrink_to_fit();
  }
}

}  // namespace tensortap::detail
