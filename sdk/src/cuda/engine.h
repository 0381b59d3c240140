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
// The arena is a ring per device, allocated once: the device memory that
// snapshots hold is bounded by it (plus, at most, one snapshot larger than
// the arena per device, which the caller allocates).

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

#include "sdk/src/staging.h"
#include "writers/src/writer.h"

namespace tensortap::detail {

/// Pinned host memory for Staging (`cudaHostAlloc`, portable to every
/// device). When pinning fails it falls back to pageable memory, and says so
/// once on stderr: captures stay correct, only slower.
HostMemory pinned_host_memory();

/// Bytes of pinned memory that `pinned_host_memory()` holds now.
std::size_t pinned_host_bytes() noexcept;

/// How many CUDA devices the runtime sees: 0 when there is no device or no
/// driver (the runtime library loads without one).
int cuda_device_count() noexcept;

/// "cudaErrorMemoryAllocation: out of memory", for messages.
std::string cuda_error_string(cudaError_t error);

/// Settings of a CudaEngine.
struct CudaEngineOptions {
  /// Device memory per device that snapshots may hold (the arena), taken
  /// when the device's first snapshot is reserved.
  std::size_t device_bytes = std::size_t{128} << 20;
  /// Records in flight per device at most, when records are tiny: one CUDA
  /// event each, all created with the arena.
  std::size_t max_records = 1024;
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

  /// Room for one snapshot, from `reserve()` to `submit()` or `cancel()`.
  struct Snapshot {
    int device = -1;
    /// Where the snapshot goes (device memory). Null for an empty record,
    /// and for a snapshot larger than the arena (`external`): the caller
    /// allocates that one and sets `data` before `submit()`.
    void* data = nullptr;
    std::size_t nbytes = 0;
    bool external = false;
    // The engine's own: the arena region and the pooled event.
    std::uint64_t region = 0;
    cudaEvent_t ready = nullptr;
  };

  /// `staging` and `report` must outlive the engine.
  CudaEngine(Staging& staging, CudaEngineOptions options, Report report);
  /// Stops (see `stop()`).
  ~CudaEngine();
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
  /// `stream` and queues the record. `unit` is the element size: a record
  /// larger than a staging buffer is split on element boundaries. `release`
  /// runs on the copier thread when the copy from `snap.data` has completed
  /// (for an external snapshot: frees it). Throws `Error` when the event
  /// cannot be recorded; the snapshot is given back all the same.
  void submit(Snapshot snap, cudaStream_t stream, std::shared_ptr<const RecordMeta> meta,
              std::uint64_t record, std::size_t unit, std::function<void()> release = {});

  /// Training thread: gives back a snapshot whose copy failed. The room is
  /// reused only after `stream` has passed this point, in case part of the
  /// copy was enqueued.
  void cancel(Snapshot snap, cudaStream_t stream, std::function<void()> release = {}) noexcept;

  /// Returns when every record submitted before the call is committed to
  /// staging (or has failed).
  void flush();

  /// Commits everything submitted, ends the copier thread and frees the
  /// device memory. Later reservations return nullopt. Call it before the
  /// staging's writer stops, or what is still queued is lost (and reported).
  void stop();

  CudaEngineCounters counters() const;

 private:
  struct Region {
    std::size_t offset = 0;
    std::size_t size = 0;
    bool done = false;
  };
  // One CUDA device's arena, pools and copy stream. Created when the device
  // gets its first snapshot.
  struct Device {
    bool ready = false;
    char* arena = nullptr;
    std::size_t capacity = 0;
    // Live regions in allocation order; the id of regions.front() is
    // first_region. Regions are freed out of order (the copier works in
    // submission order, threads submit in any order) but room is reclaimed
    // from the front only, as in any ring.
    std::deque<Region> regions;
    std::uint64_t first_region = 1;
    std::size_t in_flight = 0;
    bool external_busy = false;
    std::vector<cudaEvent_t> ready_events;
    std::vector<cudaEvent_t> done_events;
    cudaStream_t copy_stream = nullptr;
  };
  // A submitted record, as the copier sees it.
  struct Item {
    std::shared_ptr<const RecordMeta> meta;
    std::uint64_t record = 0;
    Snapshot snap;
    std::size_t unit = 0;
    std::function<void()> release;
    // Cancelled, or its event could not be recorded: free it, copy nothing.
    bool skip = false;
  };
  // One cudaMemcpyAsync.
  struct Run {
    char* dst = nullptr;
    const char* src = nullptr;
    std::size_t nbytes = 0;
    const Staging::Buffer* buffer = nullptr;
    // Runs from the arena may merge with the next one.
    bool mergeable = false;
  };
  // A staging reservation the batch commits when it completes: a whole
  // record or one chunk of it. `meta` names it if the copy fails.
  struct Piece {
    Staging::Ticket ticket;
    const RecordMeta* meta;
  };
  // Copies issued together on one device's copy stream, completed by one
  // event.
  struct Batch {
    int device = -1;
    std::vector<cudaEvent_t> waits;
    std::vector<Run> runs;
    std::vector<Piece> pieces;
    // Records whose last byte is copied by this batch: their snapshot is
    // freed when it completes.
    std::vector<Item> items;
    cudaEvent_t done = nullptr;
    std::string error;
    bool empty() const { return waits.empty() && runs.empty() && pieces.empty() && items.empty(); }
  };

  void init_device(int index, Device& d);
  // The arena offset for `size` bytes, if there is room.
  static std::optional<std::size_t> place(const Device& d, std::size_t size);
  void free_region(Device& d, std::uint64_t region);
  void enqueue(Item item);
  void say(const std::string& what) noexcept;

  // Copier thread.
  void run() noexcept;
  void process(Item& item, std::vector<Batch>& open, std::deque<Batch>& inflight);
  void add_piece(Batch& batch, const Item& item, const Staging::Ticket& ticket, std::size_t offset);
  void issue(Batch& batch, std::deque<Batch>& inflight);
  // Completes the oldest batch; with `block` false only if it is done.
  bool retire(std::deque<Batch>& inflight, bool block);
  void retire_all(std::deque<Batch>& inflight);
  cudaEvent_t done_event(int device, std::string& error);

  Staging& staging_;
  const CudaEngineOptions options_;
  Report report_;

  mutable std::mutex mu_;
  std::condition_variable work_cv_;  // the copier waits for records
  std::condition_variable room_cv_;  // reserve() waits for arena room
  std::condition_variable done_cv_;  // flush() waits for the copier
  std::vector<std::unique_ptr<Device>> devices_;
  std::vector<Item> queue_;
  // Reservations not yet submitted or cancelled: the copier does not end
  // while one may still arrive.
  std::size_t outstanding_ = 0;
  std::uint64_t submitted_ = 0;
  std::uint64_t retired_ = 0;
  bool stopping_ = false;
  bool stopped_ = false;
  // Held for the whole of stop(): a second caller returns once it is done.
  std::mutex stop_mu_;
  std::atomic<std::uint64_t> records_{0};
  std::atomic<std::uint64_t> copies_{0};
  std::atomic<std::uint64_t> refused_{0};
  std::atomic<std::uint64_t> events_created_{0};
  std::thread thread_;
};

}  // namespace tensortap::detail
