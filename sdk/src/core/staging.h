#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <utility>
#include <vector>

#include <tensortap/options.h>

#include "sdk/src/core/record.h"
#include "sdk/src/core/spin_lock.h"
#include "sdk/src/core/waits.h"

namespace tensortap::detail {

/// One piece of a record in a staging buffer. A record larger than a buffer
/// is split into chunks that carry the same `record` and `id`.
struct Slot {
  Record record;
  /// Identifies the record across its chunks.
  std::uint64_t id = 0;
  /// Where the bytes are in the buffer.
  std::size_t offset = 0;
  std::size_t nbytes = 0;
  bool first = true;
  bool last = true;
  /// False when the copy into staging failed: the writer drops the record.
  bool ok = true;
  /// The record's name, when the capture handed the name table's own copy
  /// (`RecordSpec::name_kept`): `name_slots()` copies it into `record`, on
  /// the writer thread, so the capture copies no string.
  const std::string* name_ref = nullptr;
};

/// A staging buffer's slots. Clearing keeps them, and a reservation copies
/// its record into a kept slot: the name's and the shape's memory is then
/// allocated once per slot, not once per record on the capturing thread and
/// freed on the writer thread (which glibc's per-thread caches never give
/// back, so every such allocation took malloc's slow path).
class SlotList {
  // Blocks of a power of two of slots, which never move once made: growing
  // copies no slot, and slot i is two loads away (a deque's indexing and
  // size() were some 45 instructions of every capture).
  static constexpr std::size_t kBlockShift = 8;
  static constexpr std::size_t kBlock = std::size_t{1} << kBlockShift;

 public:
  class const_iterator {
   public:
    const_iterator(const SlotList* list, std::size_t i) : list_(list), i_(i) {}
    const Slot& operator*() const { return (*list_)[i_]; }
    const_iterator& operator++() {
      ++i_;
      return *this;
    }
    bool operator!=(const const_iterator& other) const { return i_ != other.i_; }

   private:
    const SlotList* list_;
    std::size_t i_;
  };
  const_iterator begin() const { return {this, 0}; }
  const_iterator end() const { return {this, size_}; }
  std::size_t size() const { return size_; }
  bool empty() const { return size_ == 0; }
  Slot& operator[](std::size_t i) { return blocks_[i >> kBlockShift][i & (kBlock - 1)]; }
  const Slot& operator[](std::size_t i) const { return blocks_[i >> kBlockShift][i & (kBlock - 1)]; }
  /// Appends a slot, a kept one where there is one: the caller overwrites
  /// every member.
  Slot& add() {
    if (size_ == blocks_.size() * kBlock) blocks_.push_back(std::make_unique<Slot[]>(kBlock));
    return (*this)[size_++];
  }
  /// Takes back the slot `add()` returned last, which could not be filled.
  void drop_last() { --size_; }
  void clear() { size_ = 0; }

 private:
  std::vector<std::unique_ptr<Slot[]>> blocks_;
  std::size_t size_ = 0;
};

/// Where staging buffers' memory comes from. The default (both null) is
/// mapped heap memory, with huge pages where allowed, populated by
/// `Staging::prepare()`; the CUDA engine passes pinned memory, which the
/// GPU's copy engine can write into without a bounce through the driver.
struct HostMemory {
  /// Returns `bytes` (a multiple of 4096) of page-aligned memory, or nullptr.
  void* (*allocate)(std::size_t bytes) = nullptr;
  /// Gives back what `allocate` returned.
  void (*release)(void* data) = nullptr;
};

/// The two host staging buffers between capturing threads and the writer
/// thread. Capturing threads reserve space in the filling buffer, copy into
/// it without holding the lock, and commit. The writer takes the filling
/// buffer whenever it holds committed data and nothing is being copied into
/// it, swapping in the other (empty) one, so captures never wait for a
/// buffer to fill up before it reaches the disk. When the filling buffer has
/// no room, the policy decides: wait for the swap, or drop.
class Staging {
 public:
  /// The training threads waiting inside tensortap (staging's own waits
  /// for room, flush(), close()), for the stall watchdog.
  Waits& waits() { return waits_; }

  /// Seconds the capturing threads waited for room (`Overflow::Block`).
  double blocked_seconds() const { return static_cast<double>(blocked_ns_.load(std::memory_order_relaxed)) * 1e-9; }

  struct Buffer {
    char* data = nullptr;
    std::size_t used = 0;
    SlotList slots;
    /// Reservations not yet committed: the writer may not take the buffer.
    int pending = 0;
  };
  /// A reservation: copy `nbytes` into `dst`, then `commit()`.
  struct Ticket {
    Buffer* buffer;
    std::size_t slot;
    char* dst;
    std::size_t nbytes;
  };

  /// `capacity` is each buffer's size. Memory is taken from `memory` on
  /// first use, or, for the default memory, by `prepare()`.
  Staging(std::size_t capacity, Overflow overflow, HostMemory memory = {});
  ~Staging();
  Staging(const Staging&) = delete;
  Staging& operator=(const Staging&) = delete;

  std::size_t capacity() const { return capacity_; }

  /// Reserves `nbytes` (at most `capacity()`) in a slot for record `spec`,
  /// copied in. `first`: these are the record's first bytes. When there is
  /// no room it waits, or returns nullopt if `may_drop` and the policy is
  /// `DropNewest`. Returns nullopt once `stop()` was called.
  ///
  /// With a `unit` (a chunk of a record larger than a buffer), `nbytes` is
  /// what remains of the record: it reserves as much of it as fits, in
  /// whole units, but not less than 64 KiB (or the rest), and sets the
  /// slot's `last` when that is all of it.
  ///
  /// With `wait = false` it returns nullopt instead of waiting: a thread that
  /// holds uncommitted tickets (the CUDA copier, whose copies are in flight)
  /// must commit them before it waits, or the writer could never take the
  /// buffer it waits on.
  std::optional<Ticket> reserve(const RecordSpec& spec, std::size_t nbytes, bool first, bool may_drop,
                                std::size_t unit = 0, bool wait = true);
  /// The same, for a request built as a slot: its record and id, `nbytes`
  /// (what remains) and `first`.
  std::optional<Ticket> reserve(const Slot& slot, bool may_drop, std::size_t unit = 0, bool wait = true) {
    return reserve(RecordSpec::of(slot.record, slot.id), slot.nbytes, slot.first, may_drop, unit, wait);
  }
  /// `reserve()` of all of `spec.nbytes`, a copy of them from `src` and
  /// `commit()` under one lock: for a small record, whose copy costs less
  /// than a second round of the lock. False where `reserve()` returns
  /// nullopt.
  bool put(const RecordSpec& spec, const void* src, bool may_drop);
  /// Copies `n` bytes from `src` to a ticket's `dst`. From 32 KiB up it
  /// stores past the caches: the writer thread on the other core last
  /// read these lines, and ordinary stores would first fetch each one back
  /// from it (bench/README.md, "Large copies into staging").
  static void copy(char* dst, const void* src, std::size_t n);
  /// Publishes a reservation; `ok = false` tells the writer to drop it.
  /// Wakes the writer only when the buffer is half full or a thread waits.
  void commit(const Ticket& ticket, bool ok);
  /// Wakes the writer if the filling buffer holds committed data: called
  /// once per step, so small records are written within a step.
  void kick();
  /// Returns when every slot reserved before the call has been released.
  void wait_drained();

  /// Writer side, once at its start: allocates and populates both buffers
  /// of default (heap) memory, so that no capture pays their page faults.
  /// Captures need not wait for it. Without it (or if it fails) a buffer
  /// is allocated on first use and its pages faulted in as they are.
  void prepare();
  /// Writer side: waits for a buffer with committed slots and takes it.
  /// Returns nullptr once `stop()` was called and everything is taken.
  Buffer* take();
  /// take(), waiting at most `limit`: nullopt when nothing could be taken
  /// by then. Committed slots are taken when the limit passes even if no
  /// commit woke the writer (commits wake it only when half a buffer is
  /// full, and kick() only at step()), so a run paused between steps
  /// still has its last records written within the limit.
  std::optional<Buffer*> take_within(std::chrono::milliseconds limit);
  /// Writer side, on a taken buffer: copies the names its slots keep by
  /// reference into their records, which are whole from then on. Throws
  /// (out of memory) as the writer's own work does.
  static void name_slots(Buffer& buffer);
  /// Writer side: hands a taken buffer back, empty.
  void release(Buffer* buffer);
  /// Moves the buffers to memory from `memory` (the CUDA copier's pinned
  /// memory, once a CUDA tensor is captured): both buffers are allocated by
  /// the calling thread, before the lock is taken, so no capturing thread
  /// waits for the allocation. An idle buffer moves at once, one in use when
  /// the writer hands it back; the old memory goes back to where it came
  /// from. Returns false, changing nothing, when `memory` gives no memory or
  /// the staging is stopping.
  bool adopt(HostMemory memory);
  /// Makes `take()` return nullptr once the staging is empty.
  void stop();
  /// Gives the buffers' memory back; only after the writer has stopped.
  void free_memory();

 private:
  void* allocate() const;
  // Gives back memory taken from `from` (the default: mapped by allocate()).
  void release_memory(void* data, const HostMemory& from) const;
  // Under mu_: the buffer `i` is idle, so it moves to the memory adopt()
  // set aside for it. Returns the memory it leaves, for the caller to give
  // back outside the lock.
  std::pair<void*, HostMemory> move_to_spare(int i);
  std::optional<Ticket> reserve_locked(std::unique_lock<SpinLock>& lock, const RecordSpec& spec, std::size_t nbytes,
                                       bool first, bool may_drop, std::size_t unit, bool wait);
  // Under mu_: the slot for `n` bytes of `spec` at `offset` of the filling
  // buffer `b`, which has room and memory, counted as pending.
  Slot& add_slot(Buffer& b, const RecordSpec& spec, std::size_t offset, std::size_t n, bool first, bool last);
  // Returns whether the writer must be woken (after the lock is released).
  bool commit_locked(const Ticket& ticket, bool ok);
  // Under mu_, after a commit into `b`: whether to wake the writer.
  bool wakes(Buffer& b);

  std::size_t capacity_;
  Overflow overflow_;
  // Where new buffers come from, and where each buffer's memory came from.
  HostMemory memory_;
  HostMemory held_[2];
  // Memory adopt() allocated for a buffer that was in use then.
  void* spare_[2] = {nullptr, nullptr};
  // A spin lock, where a pthread mutex cost 57 of a capture's instructions:
  // what it guards is short (a slot, a copy of at most 16 KiB in put()),
  // and every wait goes through a condition variable that lets it go.
  // condition_variable_any takes its own mutex before it lets mu_ go, so a
  // notify after a change made under mu_ is never lost; only a wake-up pays
  // for that mutex. Under mu_ otherwise: a notify_one() where a thread is
  // about to wait for the writer (it takes that mutex for a moment), and a
  // buffer's allocation on first use, where prepare() did not make it
  // (memory from a HostMemory hook, or prepare() failed): twice a run at
  // most.
  SpinLock mu_;
  std::condition_variable_any writer_cv_;   // the writer waits for data
  std::condition_variable_any space_cv_;    // capturers wait for room
  std::condition_variable_any drained_cv_;  // flush() waits for the writer
  // A wait for room of `d` by a capture of `step`; mu_ is held.
  void waited(std::int64_t step, std::chrono::steady_clock::duration d);
  static constexpr std::int64_t kSlowStepNs = 100'000'000;

  Buffer buffers_[2];
  int fill_ = 0;
  bool stopping_ = false;
  std::uint64_t reserved_ = 0;
  // Threads waiting for room or for the drain: commits then wake the writer.
  int waiting_ = 0;
  // A commit left the writer asleep: the next kick() wakes it.
  std::atomic<bool> unwoken_{false};
  // Time capturing threads waited for room (Overflow::Block), in all and in
  // the step of the latest wait; the first step past kSlowStep is said once.
  std::atomic<std::int64_t> blocked_ns_{0};
  Waits waits_;
  std::int64_t wait_step_ = -1;
  std::int64_t wait_step_ns_ = 0;
  bool said_slow_step_ = false;
  std::uint64_t released_ = 0;
};

}  // namespace tensortap::detail
