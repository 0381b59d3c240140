#include "sdk/src/core/staging.h"

#include <sys/mman.h>

#if defined(__x86_64__)
#include <emmintrin.h>
#endif

#include <cerrno>
#include <cstdio>
#include <cstring>

#include <fmt/format.h>

#include <tensortap/error.h>
#include "sdk/src/core/process.h"
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

// From this size a copy into staging bypasses the caches. Below it the
// record's lines are few, and the writer reads them sooner than memory
// would have them.
constexpr std::size_t kStreamBytes = std::size_t{32} << 10;

// Linux 5.14; older headers lack the name, older kernels answer EINVAL.
#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23
#endif

// Heap staging, with huge pages where the kernel gives them (advice only:
// without transparent huge pages it has small ones).
void* map_staging(std::size_t bytes) {
  void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) return nullptr;
  (void)::madvise(p, bytes, MADV_HUGEPAGE);
  return p;
}

}  // namespace

Staging::Staging(std::size_t capacity, Overflow overflow, HostMemory memory)
    : capacity_(capacity), overflow_(overflow), memory_(memory) {}

Staging::~Staging() {
  for (int i = 0; i < 2; ++i) {
    release_memory(buffers_[i].data, held_[i]);
    release_memory(spare_[i], memory_);
  }
}

void* Staging::allocate() const {
  const std::size_t bytes = align_up(capacity_, kPage);
  if (memory_.allocate != nullptr) return memory_.allocate(bytes);
  return map_staging(bytes);
}

void Staging::release_memory(void* data, const HostMemory& from) const {
  if (data == nullptr) return;
  if (from.release != nullptr)
    from.release(data);
  else
    ::munmap(data, align_up(capacity_, kPage));
}

void Staging::prepare() {
  // Touched on first use, a 64 MiB buffer cost 37 ms of page faults spread
  // over the first captures (bench/README.md). Here every page is faulted
  // in by the writer thread instead.
  const std::size_t bytes = align_up(capacity_, kPage);
  for (Buffer& b : buffers_) {
    char* data = nullptr;
    {
      std::lock_guard<SpinLock> lock(mu_);
      // Memory from a HostMemory hook (pinned, once the copier adopted it)
      // is its owner's to place.
      if (stopping_ || memory_.allocate != nullptr) return;
      data = b.data;
    }
    if (data == nullptr) {
      data = static_cast<char*>(map_staging(bytes));
      if (data == nullptr) return;  // the first reserve() tries again, and reports a failure
      // Without MADV_POPULATE_WRITE (before Linux 5.14; the length-0 call
      // asks): write each page before anyone can see the memory.
      if (::madvise(data, 0, MADV_POPULATE_WRITE) != 0) {
        auto* page = static_cast<volatile char*>(static_cast<void*>(data));
        for (std::size_t i = 0; i < bytes; i += kPage) page[i] = 0;
      }
      std::unique_lock<SpinLock> lock(mu_);
      if (b.data == nullptr) {
        b.data = data;
        held_[&b - buffers_] = HostMemory{};
      } else {
        // A capture (or adopt()) came first.
        lock.unlock();
        release_memory(data, HostMemory{});
        continue;
      }
    }
    // Published at once: MADV_POPULATE_WRITE faults pages in without
    // writing to them, so captures may fill the buffer meanwhile (ENOMEM
    // and the like leave the rest to first use, as before). Should adopt()
    // move the buffer to pinned memory meanwhile, this advice on a range
    // that is gone changes nothing.
    (void)::madvise(data, bytes, MADV_POPULATE_WRITE);
  }
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
    std::lock_guard<SpinLock> lock(mu_);
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

void Staging::copy(char* dst, const void* src, std::size_t n) {
#if defined(__x86_64__)
  // SSE2, which every x86-64 has. Tickets start on 64-byte boundaries, so
  // the stores are aligned; the source need not be.
  if (n >= kStreamBytes && reinterpret_cast<std::uintptr_t>(dst) % 16 == 0) {
    const char* s = static_cast<const char*>(src);
    std::size_t i = 0;
    for (; i + 64 <= n; i += 64) {
      const __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i));
      const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i + 16));
      const __m128i c = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i + 32));
      const __m128i d = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i + 48));
      _mm_stream_si128(reinterpret_cast<__m128i*>(dst + i), a);
      _mm_stream_si128(reinterpret_cast<__m128i*>(dst + i + 16), b);
      _mm_stream_si128(reinterpret_cast<__m128i*>(dst + i + 32), c);
      _mm_stream_si128(reinterpret_cast<__m128i*>(dst + i + 48), d);
    }
    std::memcpy(dst + i, s + i, n - i);
    // Streaming stores are weakly ordered: they must be visible before the
    // commit that hands the bytes to the writer thread.
    _mm_sfence();
    return;
  }
#endif
  std::memcpy(dst, src, n);
}

std::optional<Staging::Ticket> Staging::reserve(const RecordSpec& spec, std::size_t nbytes, bool first, bool may_drop,
                                                std::size_t unit, bool wait) {
  std::unique_lock<SpinLock> lock(mu_);
  return reserve_locked(lock, spec, nbytes, first, may_drop, unit, wait);
}

bool Staging::put(const RecordSpec& spec, const void* src, bool may_drop) {
  bool wake = false;
  {
    std::unique_lock<SpinLock> lock(mu_);
    Buffer& b = buffers_[fill_];
    const std::size_t offset = align_up(b.used, kRecordAlign);
    if (!stopping_ && b.data != nullptr && offset <= capacity_ && spec.nbytes <= capacity_ - offset) {
      // The common case, with room: the slot, the copy and its commit in
      // one go, without a ticket.
      add_slot(b, spec, offset, spec.nbytes, true, true);
      if (spec.nbytes != 0) std::memcpy(b.data + offset, src, spec.nbytes);
      --b.pending;
      wake = wakes(b);
    } else {
      const std::optional<Ticket> ticket = reserve_locked(lock, spec, spec.nbytes, true, may_drop, 0, true);
      if (!ticket) return false;
      if (ticket->nbytes != 0) std::memcpy(ticket->dst, src, ticket->nbytes);
      wake = commit_locked(*ticket, true);
    }
  }
  if (wake) writer_cv_.notify_one();
  return true;
}

Slot& Staging::add_slot(Buffer& b, const RecordSpec& spec, std::size_t offset, std::size_t n, bool first, bool last) {
  // The slot goes in first: if that throws, nothing counts it as pending.
  Slot& slot = b.slots.add();
  slot.name_ref = spec.name_kept ? &spec.name : nullptr;
  try {
    slot.record.assign(spec, /*with_name=*/!spec.name_kept);
  } catch (...) {
    b.slots.drop_last();
    throw;
  }
  slot.id = spec.id;
  slot.offset = offset;
  slot.nbytes = n;
  slot.first = first;
  slot.last = last;
  slot.ok = true;
  b.used = offset + n;
  ++b.pending;
  ++reserved_;
  return slot;
}

std::optional<Staging::Ticket> Staging::reserve_locked(std::unique_lock<SpinLock>& lock, const RecordSpec& spec,
                                                       std::size_t nbytes, bool first, bool may_drop, std::size_t unit,
                                                       bool wait) {
  for (;;) {
    // A hook that raced with close() must not queue what no writer drains.
    if (stopping_) return std::nullopt;
    Buffer& b = buffers_[fill_];
    const std::size_t offset = align_up(b.used, kRecordAlign);
    const std::size_t room = offset < capacity_ ? capacity_ - offset : 0;
    std::size_t n = nbytes;
    bool fits = n <= room;
    if (unit != 0) {
      const std::size_t least = std::min(nbytes, std::max(unit, std::min(capacity_, kMinChunk) / unit * unit));
      n = std::min(nbytes, room / unit * unit);
      fits = n >= least && n > 0;
    }
    if (fits) {
      if (b.data == nullptr) {
        b.data = static_cast<char*>(allocate());
        held_[fill_] = memory_;
        if (b.data == nullptr)
          fail(
              "cannot allocate a staging buffer of {} bytes "
              "(Options::buffer_bytes)",
              capacity_);
      }
      add_slot(b, spec, offset, n, first, unit == 0 || n == nbytes);
      return Ticket{&b, b.slots.size() - 1, b.data + offset, n};
    }
    if (may_drop && overflow_ == Overflow::DropNewest) return std::nullopt;
    // No room: the writer must take this buffer now, not at the next kick().
    if (b.pending == 0) writer_cv_.notify_one();
    if (!wait) return std::nullopt;
    // The buffer holds data (an empty one has room for any slot), so the
    // writer will take it once the pending copies are committed.
    ++waiting_;
    const auto since = std::chrono::steady_clock::now();
    {
      // The copier's waits are not training's to be named.
      std::optional<Waits::Scope> named;
      if (!on_background_thread()) named.emplace(waits_, "a wait for staging room (Overflow::Block)");
      space_cv_.wait(lock);
    }
    --waiting_;
    // The copier's waits are its own; a capturing thread's are training's.
    if (!on_background_thread()) waited(spec.step, std::chrono::steady_clock::now() - since);
  }
}

void Staging::waited(std::int64_t step, std::chrono::steady_clock::duration d) {
  // Under mu_: the wait is over, and this is the slow path.
  const std::int64_t ns = std::chrono::duration_cast<std::chrono::nanoseconds>(d).count();
  blocked_ns_.fetch_add(ns, std::memory_order_relaxed);
  if (step != wait_step_) {
    wait_step_ = step;
    wait_step_ns_ = 0;
  }
  wait_step_ns_ += ns;
  if (said_slow_step_ || wait_step_ns_ < kSlowStepNs) return;
  said_slow_step_ = true;
  // "The training thread never waits for the disk" holds unless staging is
  // full under Block: say so once, with what avoids it.
  std::fprintf(stderr,
               "tensortap: warning: step %lld waited %.3g s for staging room (Overflow::Block); Format::Packed, "
               "Overflow::DropNewest or a larger buffer_bytes avoid it\n",
               static_cast<long long>(step), static_cast<double>(wait_step_ns_) * 1e-9);
}

void Staging::commit(const Ticket& ticket, bool ok) {
  bool wake = false;
  {
    std::lock_guard<SpinLock> lock(mu_);
    wake = commit_locked(ticket, ok);
  }
  if (wake) writer_cv_.notify_one();
}

bool Staging::commit_locked(const Ticket& ticket, bool ok) {
  Buffer& b = *ticket.buffer;
  if (!ok) b.slots[ticket.slot].ok = false;
  // Waking the writer is a futex call, and in a VM an interrupt to the
  // other core: microseconds of the capturing thread, per record. Wake it
  // when there is enough to write or someone waits for it; kick(), once a
  // step, wakes it for the rest.
  // Once stop() has begun nothing else will: the writer drains and exits.
  --b.pending;
  return wakes(b);
}

bool Staging::wakes(Buffer& b) {
  const bool wake = b.pending == 0 && (waiting_ > 0 || stopping_ || b.used >= capacity_ / 2);
  if (!wake) unwoken_.store(true, std::memory_order_relaxed);
  return wake;
}

void Staging::kick() {
  // Most steps commit nothing: no lock for them.
  if (!unwoken_.exchange(false, std::memory_order_relaxed)) return;
  bool wake = false;
  {
    std::lock_guard<SpinLock> lock(mu_);
    const Buffer& b = buffers_[fill_];
    wake = !b.slots.empty() && b.pending == 0;
  }
  if (wake) writer_cv_.notify_one();
}

void Staging::wait_drained() {
  std::unique_lock<SpinLock> lock(mu_);
  const std::uint64_t target = reserved_;
  ++waiting_;
  if (buffers_[fill_].pending == 0) writer_cv_.notify_one();
  drained_cv_.wait(lock, [&] { return released_ >= target; });
  --waiting_;
}

Staging::Buffer* Staging::take() {
  for (;;) {
    if (const std::optional<Buffer*> taken = take_within(std::chrono::hours(1))) return *taken;
  }
}

std::optional<Staging::Buffer*> Staging::take_within(std::chrono::milliseconds limit) {
  const auto deadline = std::chrono::steady_clock::now() + limit;
  std::unique_lock<SpinLock> lock(mu_);
  for (;;) {
    Buffer& b = buffers_[fill_];
    if (!b.slots.empty() && b.pending == 0) {
      fill_ ^= 1;
      lock.unlock();
      space_cv_.notify_all();
      return &b;
    }
    if (stopping_ && b.slots.empty()) return nullptr;
    if (writer_cv_.wait_until(lock, deadline) == std::cv_status::timeout) {
      // One last look: what was committed without a wake goes now.
      Buffer& last = buffers_[fill_];
      if (!last.slots.empty() && last.pending == 0) continue;
      if (stopping_ && last.slots.empty()) return nullptr;
      return std::nullopt;
    }
  }
}

void Staging::name_slots(Buffer& buffer) {
  // The buffer is the writer's until release(): no lock.
  for (std::size_t i = 0; i < buffer.slots.size(); ++i) {
    Slot& slot = buffer.slots[i];
    if (slot.name_ref != nullptr) slot.record.desc.name.assign(*slot.name_ref);
  }
}

void Staging::release(Buffer* buffer) {
  std::pair<void*, HostMemory> old;
  {
    std::lock_guard<SpinLock> lock(mu_);
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
    std::lock_guard<SpinLock> lock(mu_);
    stopping_ = true;
  }
  writer_cv_.notify_one();
  space_cv_.notify_all();
}

void Staging::free_memory() {
  // Given back outside the lock: munmap, or the CUDA runtime's free, is a
  // system call, and mu_ is a spin lock.
  std::pair<void*, HostMemory> old[4];
  SlotList slots[2];
  {
    std::lock_guard<SpinLock> lock(mu_);
    for (int i = 0; i < 2; ++i) {
      Buffer& b = buffers_[i];
      old[2 * i] = {b.data, held_[i]};
      old[2 * i + 1] = {spare_[i], memory_};
      b.data = nullptr;
      spare_[i] = nullptr;
      std::swap(slots[i], b.slots);
    }
  }
  for (const auto& [data, from] : old) release_memory(data, from);
}

}  // namespace tensortap::detail
