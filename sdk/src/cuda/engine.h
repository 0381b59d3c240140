#pragma once

// The CUDA transfer engine: takes device snapshots off the GPU into the
// host staging buffers without ever synchronizing the training thread with
// the device. Written against the CUDA runtime API only (no LibTorch CUDA
// headers), so it builds and its tests compile wherever the CUDA toolkit is,
// GPU or not. The LibTorch side is sdk/src/cuda/capture.cpp.
//
// The path of one record:
//
//   training thread                         copier thread
//   reserve(): room in the device's arena
//   (caller) copy the tensor into it on
//     its current stream, in stream order
//   submit(): record event R on that
//     stream, queue the record  ---------->  copy stream waits for R
//                                            reserve room in host staging
//                                            one cudaMemcpyAsync per run of
//                                              adjacent records
//                                            record event C; when C is done:
//                                              commit the staging tickets,
//                                              free the arena room
//
// The arena is a ring per device, allocated once. Snapshots larger than it
// are the caller's to allocate, up to a budget of bytes per device (and one
// at a time when a single one exceeds the budget): the device memory that
// snapshots hold is bounded by the arena plus that budget.

#include <cuda_runtime_api.h>

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "sdk/src/cuda/device.h"
#include "sdk/src/cuda/ring.h"
#include "sdk/src/core/record.h"
#include "sdk/src/core/staging.h"

namespace tensortap::detail {

/// Settings of a CudaEngine.
struct CudaEngineOptions {
  /// Device memory per device that snapshots may hold (the arena), taken
  /// when the device's first snapshot is reserved.
  std::size_t device_bytes = std::size_t{128} << 20;
  /// Device memory per device that snapshots larger than the arena may hold
  /// at once (the caller allocates them). One larger than this is taken
  /// only when no other such snapshot is held on its device.
  std::size_t large_bytes = std::size_t{128} << 20;
  /// CUDA events created per device with the arena, one per record in
  /// flight. Not a limit: a step with more records in flight creates more
  /// (events are cheap), and the pool keeps them.
  std::size_t max_records = 1024;
  /// Memory the staging buffers move to once the first CUDA record reaches
  /// the copier (pinned memory: `pinned_host_memory()`), allocated by the
  /// copier thread with the record's device current. None (the default):
  /// the staging keeps its own. A run that captures no CUDA tensor never
  /// allocates it, and so never creates a CUDA context for it.
  HostMemory staging_memory;
  /// Whether statistics-only captures are reduced straight into the arena
  /// (`cuda_capture_fused_stats`, TENSORTAP_CUDA_STATS): the LibTorch side's
  /// choice, kept here with the arena it uses; the engine itself ignores it.
  bool stats_in_arena = false;
  /// One event a step (TENSORTAP_CUDA_BATCH=on): `submit()` records no
  /// event; a stream's snapshots wait, holding their arena room, until
  /// `end_step()` (or a full arena, `flush()`, a capture on another stream
  /// of the device) records one event after them and hands them to the
  /// copier together. Off: an event a snapshot, handed over at once.
  bool batch_events = false;
  /// Where the arenas come from (default: cudaMalloc). When a device's
  /// arena cannot be allocated, `warn` says so once, and that device's
  /// snapshots are all allocated by the caller, within `large_bytes`.
  DeviceMemory arena_memory;
  /// Warnings: what goes on working, less well. Default: stderr.
  std::function<void(const std::string& what)> warn;
};

/// Counters, for tests and benchmarks.
struct CudaEngineCounters {
  /// Records that reached host staging (or failed there).
  std::uint64_t records = 0;
  /// cudaMemcpyAsync calls to the host: fewer than records when records
  /// were coalesced, more when records were chunked.
  std::uint64_t copies = 0;
  /// Snapshots refused because the arena was full and dropping was allowed.
  std::uint64_t refused = 0;
  /// Record events and completion events created (they are pooled).
  std::uint64_t events_created = 0;
  /// Records the copier dropped, each reported, because it failed on its
  /// own account (out of host memory for its bookkeeping).
  std::uint64_t dropped = 0;
};

/// Moves device snapshots into a Staging, through one copier thread.
///
/// Thread safety: `reserve`, `submit`, `cancel` and `flush` may be called
/// from any number of threads. Nothing here throws on the copier thread: a
/// copy that fails is committed as failed (the writer drops the record) and
/// passed to `report`, which must not throw.
class CudaEngine {
 public:
  using Report = std::function<void(const std::string& what)>;

 private:
  struct Item;

 public:
  /// Room for one snapshot, from `reserve()` to `submit()` or `cancel()`.
  struct Snapshot {
    int device = -1;
    /// Where the snapshot goes (device memory). Null for an empty record,
    /// and for a snapshot larger than the arena (`external`): the caller
    /// allocates that one and sets `data` before `submit()`.
    void* data = nullptr;
    std::size_t nbytes = 0;
    bool external = false;
    // The engine's own: the arena region, the pooled event, and the queue
    // entry allocated by reserve(), so that submit() and cancel() queue the
    // record without allocating (they cannot fail to give the room back).
    std::uint64_t region = 0;
    cudaEvent_t ready = nullptr;
    Item* item = nullptr;
  };

  /// `staging` and `report` must outlive the engine.
  CudaEngine(Staging& staging, CudaEngineOptions options, Report report);
  /// Stops (see `stop()`).
  ~CudaEngine();
  /// See CudaEngineOptions::stats_in_arena.
  bool stats_in_arena() const { return options_.stats_in_arena; }
  /// See CudaEngineOptions::batch_events.
  bool batch_events() const { return options_.batch_events; }
  /// Each device's arena (CudaEngineOptions::device_bytes).
  std::size_t arena_bytes() const { return options_.device_bytes; }
  /// Steps ended so far (`end_step()` calls): with batch_events, a thread's
  /// CUDA-graph check of a stream holds until it changes.
  std::uint64_t steps_ended() const { return steps_ended_.load(std::memory_order_relaxed); }
  /// This engine among the process's (1, 2, ...): a later one at the same
  /// address is another.
  std::uint64_t id() const { return id_; }
  CudaEngine(const CudaEngine&) = delete;
  CudaEngine& operator=(const CudaEngine&) = delete;

  /// Training thread: room for `nbytes` on `device`. When the arena has no
  /// room it waits for the copier, or returns nullopt if `may_drop` (the
  /// refusal is counted). Returns nullopt once `stop()` was called. Throws
  /// `Error` when the device's arena or stream cannot be created. The first
  /// call for a device allocates its arena (the warm-up): later calls never
  /// allocate device or pinned memory.
  std::optional<Snapshot> reserve(int device, std::size_t nbytes, bool may_drop);

  /// Training thread, once the copy into `snap.data` is enqueued on
  /// `stream` (a stream of `snap.device`): records the snapshot's event on
  /// `stream` and queues the record `spec` describes, copied into the queue
  /// entry reserve() took from the engine's pool: a capture in steady state
  /// allocates nothing (the entry's name keeps its memory from record to
  /// record). `unit` is the element size: a record larger than a staging
  /// buffer is split on element boundaries. `release` runs on the copier
  /// thread when the copy from `snap.data` has completed (for an external
  /// snapshot: frees it). Throws `Error` when the record or the event
  /// cannot be made; the snapshot is queued (and given back) before anything
  /// can throw, so `stop()` never waits for it.
  void submit(Snapshot snap, cudaStream_t stream, const RecordSpec& spec, std::size_t unit,
              std::function<void()> release = {});

  /// Training thread: gives back a snapshot whose copy failed. The room is
  /// reused only after `stream` has passed this point, in case part of the
  /// copy was enqueued.
  void cancel(Snapshot snap, cudaStream_t stream, std::function<void()> release = {}) noexcept;

  /// Training thread, after a `reserve()` on `device`: a slot of
  /// `kCounterSlot` counters in the device's arena, all zero, for a launch
  /// whose blocks count themselves so that the last one merges their
  /// results (batch_kernel.cu; it leaves them zero again). Null when every
  /// slot is in use or the device has no arena: the caller launches twice.
  unsigned* take_counters(int device) noexcept;
  /// Gives a slot back once the stream is past the launch that used it (a
  /// `release` the copier runs).
  void give_counters(unsigned* slot) noexcept;
  /// Counters a slot holds, and slots a device has.
  static constexpr std::size_t kCounterSlot = 64;
  static constexpr std::size_t kCounterSlots = 16;
  static constexpr std::size_t kCounterBytes = kCounterSlots * kCounterSlot * sizeof(unsigned);

  /// A step's end (the training thread's `Recorder::step()`): with
  /// batch_events, records one event on each stream with snapshots waiting
  /// and hands them to the copier; without, nothing. Never throws: a
  /// failure loses the waiting snapshots' records, each reported.
  void end_step() noexcept;

  /// Returns when every record submitted before the call is committed to
  /// staging (or has failed): all of them, whichever device's copies end
  /// first.
  void flush();

  /// Commits everything submitted, ends the copier thread and frees the
  /// device memory. Later reservations return nullopt. Call it before the
  /// staging's writer stops, or what is still queued is lost (and reported).
  void stop();

  CudaEngineCounters counters() const;

 private:
  // A submitted record, as the copier sees it. Taken by reserve() from the
  // pool (allocated when the pool is empty), owned by whichever list holds
  // it, back in the pool once retired; deleted with the engine.
  struct Item {
    // The record, assigned in place by submit(): no allocation once its
    // name has room.
    Record own;
    const Record* record = nullptr;
    std::uint64_t id = 0;
    // Submission order (1, 2, ...): what flush() waits for.
    std::uint64_t seq = 0;
    /// What it is, for messages; null for a cancelled snapshot.
    const RecordDesc* desc() const { return record != nullptr ? &record->desc : nullptr; }
    Snapshot snap;
    std::size_t unit = 0;
    std::function<void()> release;
    // Cancelled, or its event could not be recorded: free it, copy nothing.
    bool skip = false;
    // batch_events: the last record of an event's group gives the event
    // back to the pool; the others only wait on it.
    bool owns_ready = true;
    Item* next = nullptr;
  };
  // Items in submission order, linked through Item::next: queueing one and
  // moving them from list to list never allocates, so it cannot fail.
  struct Items {
    Item* head = nullptr;
    Item* tail = nullptr;
    Items() = default;
    Items(Items&& o) noexcept : head(o.head), tail(o.tail) { o.head = o.tail = nullptr; }
    Items& operator=(Items&& o) noexcept;
    Items(const Items&) = delete;
    Items& operator=(const Items&) = delete;
    bool empty() const { return head == nullptr; }
    void push(Item* item) noexcept;
    Item* pop() noexcept;
    // Moves all of `other` to the end.
    void splice(Items& other) noexcept;
  };
  // One CUDA device's share of the engine, all under mu_ but `cuda`'s
  // completion events and stream, and `done_total`, which only the copier
  // thread uses.
  struct Device {
    // Null until the device gets its first snapshot, and after stop().
    std::unique_ptr<DeviceResources> cuda;
    // Regions of cuda->arena. The copier frees them in submission order,
    // and threads submit in any order: out of the order they were taken.
    RingAllocator ring;
    std::size_t in_flight = 0;
    // Bytes of snapshots larger than the arena, held now.
    std::size_t large_held = 0;
    // Why the device's stream or events could not be created: later
    // captures fail with it at once rather than retry on every capture.
    std::string error;
    // Events of the device in existence: the pools' vectors are kept at
    // least this large, so giving an event back never allocates.
    std::size_t ready_total = 0;
    std::size_t done_total = 0;
    // batch_events: snapshots submitted on `waiting_stream` and not yet
    // handed to the copier (no event recorded after them yet).
    Items waiting;
    cudaStream_t waiting_stream = nullptr;
    // batch_events: the counter slots past the arena's ring
    // (take_counters), zeroed once when the arena is made, and those free
    // (reserved in full then, so giving one back never allocates).
    unsigned* counters = nullptr;
    std::vector<unsigned*> free_counters;
  };
  // One cudaMemcpyAsync.
  struct Copy {
    char* dst = nullptr;
    const char* src = nullptr;
    std::size_t nbytes = 0;
    const Staging::Buffer* buffer = nullptr;
    // Copies from the arena may merge with the next one.
    bool mergeable = false;
  };
  // A staging reservation the batch commits when it completes: a whole
  // record or one chunk of it. `desc` names it if the copy fails.
  struct Piece {
    Staging::Ticket ticket;
    const RecordDesc* desc;
  };
  // Copies issued together on one device's copy stream, completed by one
  // event.
  struct Batch {
    int device = -1;
    std::vector<cudaEvent_t> waits;
    std::vector<Copy> copies;
    std::vector<Piece> pieces;
    // Records whose last byte is copied by this batch: their snapshot is
    // freed when it completes.
    Items items;
    cudaEvent_t done = nullptr;
    std::string error;
    bool empty() const { return waits.empty() && copies.empty() && pieces.empty() && items.empty(); }
  };

  // Arena regions start on 64-byte boundaries, as staging slots do: two
  // records adjacent in the arena are then adjacent in staging too, padding
  // included, and one copy moves both.
  static constexpr std::size_t kAlign = 64;
  // Batches issued but not completed. More would only hold staging tickets
  // (and so the writer) longer; fewer would leave the copy engine idle while
  // the copier thread commits.
  static constexpr std::size_t kMaxInflight = 4;

  // What a record is, for messages: "'fc1.weight' (kind grad, step 100,
  // float32 [128, 784], cuda:0)".
  static std::string describe(const RecordDesc* desc, int device);

  // Training threads (engine.cpp), reserve()'s jobs, with mu_ held: the
  // device's arena, events and the copier thread at its first snapshot;
  // room for `snap.nbytes` (the arena's region, or the budget of snapshots
  // larger than it), false when there is none now; the snapshot's event.
  void open_device(Device& d, int device);
  bool place(Device& d, Snapshot& snap, std::optional<RingAllocator::Region>& region);
  void take_event(Device& d, Snapshot& snap, const std::optional<RingAllocator::Region>& region);
  void enqueue(Item* item) noexcept;
  // Makes room for `n` events in a pool ahead of time (doubling), so that
  // giving one back later cannot throw.
  static void make_event_room(std::vector<cudaEvent_t>& pool, std::size_t n);
  // batch_events, with mu_ held: takes device `device`'s waiting snapshots
  // and an event for them (nullptr if none could be had: `error` says why).
  Items take_waiting(Device& d, int device, cudaStream_t& stream, cudaEvent_t& event, std::string& error) noexcept;
  // Records `event` on `stream` after `items` and queues them for the
  // copier (failed, each reported, when that cannot be done). No lock held.
  void hand_over(Items items, int device, cudaStream_t stream, cudaEvent_t event, std::string error) noexcept;
  // Hands over every device's waiting snapshots (end_step(), flush(), stop()).
  void hand_over_all() noexcept;
  // batch_events: a submitted (or cancelled) snapshot joins its device's
  // waiting group on `stream`.
  void wait_for_step(Item* item, cudaStream_t stream) noexcept;
  void warn(const std::string& what) noexcept;

  // Copier thread (copier.cpp), started for a record on `device`.
  void run(int device) noexcept;
  // Formats and passes a message to report_, which must not throw; neither
  // may the formatting here (a batch must not be left half retired).
  template <typename... Args>
  void report_nothrow(fmt::format_string<Args...> format, Args&&... args) noexcept;
  // Moves work_'s first record into its device's open batch. Whatever it
  // allocates, it allocates before taking a staging ticket: when it throws,
  // the record is still work_'s first and every ticket is in a batch.
  void process(Item& item);
  void add_piece(Batch& batch, const Item& item, const Staging::Ticket& ticket, std::size_t offset) noexcept;
  void issue(Batch& batch);
  // Completes the oldest batch in flight; with `block` false only if it is
  // done.
  bool retire(bool block) noexcept;
  void retire_all() noexcept;
  // Commits a completed batch's pieces (as failed, each record reported,
  // when it has an error or `failure` says why it was abandoned) and frees
  // its records.
  void finish(Batch& batch, const char* failure = nullptr) noexcept;
  // Frees what the records of `items` hold, and counts them retired.
  void free_items(Items& items) noexcept;
  // Under mu_: moves retired_ up to the record before the oldest one the
  // copier still holds.
  void update_retired() noexcept;
  // After the copier failed on its own account (an exception out of
  // process() or issue()): drops the batches being built and the records
  // not yet processed, reported and retired, so nothing waits for them.
  void abandon(const char* why) noexcept;
  cudaEvent_t done_event(int device, std::string& error);

  Staging& staging_;
  const CudaEngineOptions options_;
  Report report_;

  mutable std::mutex mu_;
  std::condition_variable work_cv_;  // the copier waits for records
  std::condition_variable room_cv_;  // reserve() waits for arena room
  std::condition_variable done_cv_;  // flush() waits for the copier
  // batch_events: groups taken from a device and not yet handed over (their
  // event being recorded outside the lock), and the threads in
  // hand_over_all() waiting for none to be.
  std::size_t handing_over_ = 0;
  std::size_t handover_waiters_ = 0;
  std::condition_variable handed_cv_;
  std::vector<std::unique_ptr<Device>> devices_;
  Items queue_;
  // Retired queue entries, for reserve() to take again.
  Items pool_;
  // The copier sleeps on work_cv_: only then does a submit wake it (a
  // notify per record cost the training thread a signal, and a futex call
  // whenever the copier slept, for each record).
  bool copier_waiting_ = false;
  // Reservations not yet submitted or cancelled: the copier does not end
  // while one may still arrive.
  std::size_t outstanding_ = 0;
  // Sequence numbers: the last one submitted, the last one the copier took
  // from queue_, and the retirement watermark (every record up to it has
  // retired; devices retire out of submission order).
  std::uint64_t submitted_ = 0;
  std::uint64_t taken_ = 0;
  std::uint64_t retired_ = 0;
  bool stopping_ = false;
  bool stopped_ = false;
  // Held for the whole of stop(): a second caller returns once it is done.
  std::mutex stop_mu_;
  std::atomic<std::uint64_t> records_{0};
  std::atomic<std::uint64_t> copies_{0};
  std::atomic<std::uint64_t> refused_{0};
  std::atomic<std::uint64_t> events_created_{0};
  std::atomic<std::uint64_t> dropped_{0};
  std::atomic<std::uint64_t> steps_ended_{0};
  const std::uint64_t id_;

  // The copier thread's own: records taken from queue_ and not yet in a
  // batch, one batch being built per device (records of several devices
  // come interleaved), and batches issued but not completed.
  Items work_;
  std::vector<Batch> open_;
  std::deque<Batch> inflight_;
  // Whether options_.staging_memory was handed to the staging yet.
  bool staging_moved_ = false;
  // The device the copier thread made current (-1: not known): only this
  // thread's code runs on it, and a DeviceGuard there restores what it
  // changed, so a record of the same device needs no runtime call.
  int copier_device_ = -1;
  // Makes `device` current on the copier thread; the runtime's result.
  cudaError_t use_device(int device);
  std::thread thread_;
};

}  // namespace tensortap::detail
