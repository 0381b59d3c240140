#include "sdk/src/cuda/engine.h"

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <unordered_map>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <tensortap/error.h>

#include "writers/src/dtypes.h"

namespace tensortap::detail {
namespace {

// Arena regions start on 64-byte boundaries, as staging slots do: two
// records adjacent in the arena are then adjacent in staging too, padding
// included, and one copy moves both.
constexpr std::size_t kAlign = 64;
constexpr std::size_t kPage = 4096;
// Batches issued but not completed. More would only hold staging tickets
// (and so the writer) longer; fewer would leave the copy engine idle while
// the copier thread commits.
constexpr std::size_t kMaxInflight = 4;

std::size_t align_up(std::size_t n, std::size_t a) { return (n + a - 1) / a * a; }

// Makes `device` current on this thread for the guard's lifetime. The
// training thread's current device is LibTorch's business: it is restored.
class DeviceGuard {
 public:
  explicit DeviceGuard(int device) {
    int current = -1;
    if (cudaGetDevice(&current) == cudaSuccess && current != device && cudaSetDevice(device) == cudaSuccess)
      previous_ = current;
  }
  ~DeviceGuard() {
    if (previous_ >= 0) cudaSetDevice(previous_);
  }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int previous_ = -1;
};

// What a record is, for messages: "'fc1.weight' (kind grad, step 100,
// float32 [128, 784], cuda:0)".
std::string describe(const RecordMeta* meta, int device) {
  if (meta == nullptr) return fmt::format("a record on cuda:{}", device);
  return fmt::format("'{}' (kind {}, step {}, {} [{}], cuda:{})", meta->name, kind_name(meta->kind), meta->step,
                     dtype_name(meta->dtype), fmt::join(meta->shape, ", "), device);
}

// Pinned blocks and their sizes. Leaked on purpose: a Staging may free its
// buffers during static destruction, after a function-local map would be gone.
std::mutex& pinned_mu() {
  static auto* mu = new std::mutex;
  return *mu;
}
std::unordered_map<void*, std::size_t>& pinned_blocks() {
  static auto* blocks = new std::unordered_map<void*, std::size_t>;
  return *blocks;
}
std::atomic<std::size_t> g_pinned_bytes{0};
std::once_flag g_pinned_warning;

void* allocate_pinned(std::size_t bytes) {
  void* p = nullptr;
  // Portable: the copy engines of every device may write into it.
  const cudaError_t e = cudaHostAlloc(&p, bytes, cudaHostAllocPortable);
  if (e == cudaSuccess) {
    try {
      std::lock_guard<std::mutex> lock(pinned_mu());
      pinned_blocks().emplace(p, bytes);
    } catch (...) {
      cudaFreeHost(p);
      return nullptr;
    }
    g_pinned_bytes.fetch_add(bytes, std::memory_order_relaxed);
    return p;
  }
  cudaGetLastError();  // not sticky: later calls must not see it
  std::call_once(g_pinned_warning, [&] {
    std::fprintf(stderr,
                 "tensortap: warning: cannot pin %zu bytes of host memory for staging (%s); CUDA tensors "
                 "are copied through pageable memory, which is slower\n",
                 bytes, cuda_error_string(e).c_str());
  });
  return std::aligned_alloc(kPage, bytes);
}

void release_pinned(void* p) {
  std::size_t bytes = 0;
  bool pinned = false;
  {
    std::lock_guard<std::mutex> lock(pinned_mu());
    auto it = pinned_blocks().find(p);
    if (it != pinned_blocks().end()) {
      pinned = true;
      bytes = it->second;
      pinned_blocks().erase(it);
    }
  }
  if (!pinned) {
    std::free(p);
    return;
  }
  // At exit the runtime may be unloading already; the memory goes with the process.
  if (cudaFreeHost(p) != cudaSuccess) cudaGetLastError();
  g_pinned_bytes.fetch_sub(bytes, std::memory_order_relaxed);
}

}  // namespace

HostMemory pinned_host_memory() {
  HostMemory m;
  m.allocate = allocate_pinned;
  m.release = release_pinned;
  return m;
}

std::size_t pinned_host_bytes() noexcept { return g_pinned_bytes.load(std::memory_order_relaxed); }

int cuda_device_count() noexcept {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return n;
}

std::string cuda_error_string(cudaError_t error) {
  return fmt::format("{}: {}", cudaGetErrorName(error), cudaGetErrorString(error));
}

CudaEngine::CudaEngine(Staging& staging, CudaEngineOptions options, Report report)
    : staging_(staging), options_(options), report_(std::move(report)) {
  if (options_.max_records < 1)
    throw Error(fmt::format("tensortap: CudaEngineOptions::max_records({}) must be at least 1", options_.max_records));
  const int n = cuda_device_count();
  devices_.reserve(static_cast<std::size_t>(n));
  for (int i = 0; i < n; ++i) devices_.push_back(std::make_unique<Device>());
}

CudaEngine::~CudaEngine() { stop(); }

void CudaEngine::init_device(int index, Device& d) {
  DeviceGuard guard(index);
  const std::size_t capacity = options_.device_bytes / kAlign * kAlign;
  if (capacity > 0) {
    void* arena = nullptr;
    const cudaError_t e = cudaMalloc(&arena, capacity);
    if (e != cudaSuccess) {
      cudaGetLastError();
      throw Error(fmt::format("tensortap: cannot allocate {} bytes on cuda:{} for tensor snapshots (the device "
                              "memory budget of the CUDA engine): {}",
                              capacity, index, cuda_error_string(e)));
    }
    d.arena = static_cast<char*>(arena);
  }
  // Non-blocking: the copies must not wait for work on the legacy default
  // stream, only for the events they are told to wait for.
  const cudaError_t e = cudaStreamCreateWithFlags(&d.copy_stream, cudaStreamNonBlocking);
  if (e != cudaSuccess) {
    cudaGetLastError();
    if (d.arena != nullptr) cudaFree(d.arena);
    d.arena = nullptr;
    throw Error(fmt::format("tensortap: cannot create a copy stream on cuda:{}: {}", index, cuda_error_string(e)));
  }
  d.capacity = capacity;
  // Every event the device can need, now: one per record in flight, one
  // per batch in flight. Capturing never creates one after this.
  d.ready_events.reserve(options_.max_records);
  d.done_events.reserve(kMaxInflight + 1);
  cudaError_t failed = cudaSuccess;
  for (std::size_t i = 0; i < options_.max_records && failed == cudaSuccess; ++i) {
    cudaEvent_t ev = nullptr;
    failed = cudaEventCreateWithFlags(&ev, cudaEventDisableTiming);
    if (failed == cudaSuccess) d.ready_events.push_back(ev);
  }
  for (std::size_t i = 0; i < kMaxInflight + 1 && failed == cudaSuccess; ++i) {
    cudaEvent_t ev = nullptr;
    // Blocking sync: the copier thread sleeps while copies run instead of
    // spinning on a core the training process may need.
    failed = cudaEventCreateWithFlags(&ev, cudaEventDisableTiming | cudaEventBlockingSync);
    if (failed == cudaSuccess) d.done_events.push_back(ev);
  }
  events_created_.fetch_add(d.ready_events.size() + d.done_events.size(), std::memory_order_relaxed);
  if (failed != cudaSuccess) {
    cudaGetLastError();
    for (cudaEvent_t ev : d.ready_events) cudaEventDestroy(ev);
    for (cudaEvent_t ev : d.done_events) cudaEventDestroy(ev);
    d.ready_events.clear();
    d.done_events.clear();
    cudaStreamDestroy(d.copy_stream);
    if (d.arena != nullptr) cudaFree(d.arena);
    d.copy_stream = nullptr;
    d.arena = nullptr;
    throw Error(fmt::format("tensortap: cannot create CUDA events on cuda:{}: {}", index, cuda_error_string(failed)));
  }
  d.ready = true;
}

std::optional<std::size_t> CudaEngine::place(const Device& d, std::size_t size) {
  if (d.regions.empty()) return size <= d.capacity ? std::optional<std::size_t>(0) : std::nullopt;
  const Region& front = d.regions.front();
  const Region& back = d.regions.back();
  const std::size_t end = back.offset + back.size;
  if (back.offset >= front.offset) {
    // Live bytes are [front, end): room after them, or before them.
    if (end + size <= d.capacity) return end;
    if (size <= front.offset) return 0;
    return std::nullopt;
  }
  // Wrapped: live bytes are [front, capacity) and [0, end).
  if (end + size <= front.offset) return end;
  return std::nullopt;
}

void CudaEngine::free_region(Device& d, std::uint64_t region) {
  d.regions[static_cast<std::size_t>(region - d.first_region)].done = true;
  while (!d.regions.empty() && d.regions.front().done) {
    d.regions.pop_front();
    ++d.first_region;
  }
}

std::optional<CudaEngine::Snapshot> CudaEngine::reserve(int device, std::size_t nbytes, bool may_drop) {
  if (device < 0 || static_cast<std::size_t>(device) >= devices_.size())
    throw Error(fmt::format("tensortap: no CUDA device cuda:{} (the CUDA runtime sees {} device(s))", device,
                            devices_.size()));
  std::unique_lock<std::mutex> lock(mu_);
  Device& d = *devices_[static_cast<std::size_t>(device)];
  for (;;) {
    if (stopping_) return std::nullopt;
    if (!d.ready) init_device(device, d);
    if (!thread_.joinable()) thread_ = std::thread([this] { run(); });

    Snapshot snap;
    snap.device = device;
    snap.nbytes = nbytes;
    std::optional<std::size_t> offset;
    bool room = d.in_flight < options_.max_records;
    if (room && nbytes > 0) {
      if (align_up(nbytes, kAlign) > d.capacity) {
        // The caller allocates it; one at a time per device keeps the
        // device memory bounded all the same.
        snap.external = true;
        room = !d.external_busy;
      } else {
        offset = place(d, align_up(nbytes, kAlign));
        room = offset.has_value();
      }
    }
    if (room) {
      if (nbytes > 0) {
        // Pooled, max_records of them: never empty while in_flight is
        // below that, but creating one is no error either.
        if (!d.ready_events.empty()) {
          snap.ready = d.ready_events.back();
          d.ready_events.pop_back();
        } else {
          DeviceGuard guard(device);
          const cudaError_t e = cudaEventCreateWithFlags(&snap.ready, cudaEventDisableTiming);
          if (e != cudaSuccess) {
            cudaGetLastError();
            throw Error(fmt::format("tensortap: cannot create a CUDA event on cuda:{}: {}", device,
                                    cuda_error_string(e)));
          }
          events_created_.fetch_add(1, std::memory_order_relaxed);
        }
      }
      if (snap.external) {
        d.external_busy = true;
      } else if (offset) {
        d.regions.push_back(Region{*offset, align_up(nbytes, kAlign), false});
        snap.region = d.first_region + d.regions.size() - 1;
        snap.data = d.arena + *offset;
      }
      ++d.in_flight;
      ++outstanding_;
      return snap;
    }
    if (may_drop) {
      refused_.fetch_add(1, std::memory_order_relaxed);
      return std::nullopt;
    }
    room_cv_.wait(lock);
  }
}

void CudaEngine::enqueue(Item item) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    queue_.push_back(std::move(item));
    --outstanding_;
    ++submitted_;
  }
  work_cv_.notify_one();
}

void CudaEngine::submit(Snapshot snap, cudaStream_t stream, std::shared_ptr<const RecordMeta> meta,
                        std::uint64_t record, std::size_t unit, std::function<void()> release) {
  Item item;
  item.meta = std::move(meta);
  item.record = record;
  item.snap = snap;
  item.unit = std::max<std::size_t>(unit, 1);
  item.release = std::move(release);
  std::string error;
  if (snap.nbytes > 0 && snap.data == nullptr) {
    item.skip = true;
    error = fmt::format("tensortap: no snapshot memory for {}", describe(item.meta.get(), snap.device));
  } else if (snap.ready != nullptr) {
    const cudaError_t e = cudaEventRecord(snap.ready, stream);
    if (e != cudaSuccess) {
      cudaGetLastError();
      item.skip = true;
      error = fmt::format("tensortap: cannot record a CUDA event after the snapshot of {}: {}",
                          describe(item.meta.get(), snap.device), cuda_error_string(e));
    }
  }
  // A failed record still goes through the copier, which frees its room.
  enqueue(std::move(item));
  if (!error.empty()) throw Error(error);
}

void CudaEngine::cancel(Snapshot snap, cudaStream_t stream, std::function<void()> release) noexcept {
  Item item;
  item.snap = snap;
  item.skip = true;
  item.release = std::move(release);
  // Part of the copy may have been enqueued: the room is reused only once
  // the stream is past it.
  if (snap.ready != nullptr && cudaEventRecord(snap.ready, stream) != cudaSuccess) cudaGetLastError();
  try {
    enqueue(std::move(item));
  } catch (...) {
    // Out of memory queueing it: the room stays taken, which only costs room.
  }
}

void CudaEngine::say(const std::string& what) noexcept {
  // A callback that throws must not leave a batch half retired.
  try {
    report_(what);
  } catch (...) {
  }
}

void CudaEngine::flush() {
  std::unique_lock<std::mutex> lock(mu_);
  const std::uint64_t target = submitted_;
  done_cv_.wait(lock, [&] { return retired_ >= target; });
}

void CudaEngine::stop() {
  std::lock_guard<std::mutex> stopping(stop_mu_);
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopped_) return;
    stopping_ = true;
  }
  work_cv_.notify_all();
  room_cv_.notify_all();
  // No reservation starts the thread once stopping_ is set.
  if (thread_.joinable()) thread_.join();
  std::lock_guard<std::mutex> lock(mu_);
  stopped_ = true;
  for (std::size_t i = 0; i < devices_.size(); ++i) {
    Device& d = *devices_[i];
    if (!d.ready) continue;
    DeviceGuard guard(static_cast<int>(i));
    for (cudaEvent_t e : d.ready_events) cudaEventDestroy(e);
    for (cudaEvent_t e : d.done_events) cudaEventDestroy(e);
    d.ready_events.clear();
    d.done_events.clear();
    if (d.copy_stream != nullptr) cudaStreamDestroy(d.copy_stream);
    if (d.arena != nullptr) cudaFree(d.arena);
    d.copy_stream = nullptr;
    d.arena = nullptr;
    d.ready = false;
    cudaGetLastError();
  }
}

CudaEngineCounters CudaEngine::counters() const {
  CudaEngineCounters c;
  c.records = records_.load(std::memory_order_relaxed);
  c.copies = copies_.load(std::memory_order_relaxed);
  c.refused = refused_.load(std::memory_order_relaxed);
  c.events_created = events_created_.load(std::memory_order_relaxed);
  return c;
}

// ---- copier thread ---------------------------------------------------------

void CudaEngine::run() noexcept {
  std::deque<Batch> inflight;
  std::vector<Item> work;
  // One batch being built per device: records of several devices may come
  // interleaved.
  std::vector<Batch> open(devices_.size());
  for (std::size_t i = 0; i < open.size(); ++i) open[i].device = static_cast<int>(i);
  for (;;) {
    try {
      {
        std::unique_lock<std::mutex> lock(mu_);
        if (queue_.empty() && !inflight.empty()) {
          // Nothing new: finish what is in flight, so flush() returns and
          // the room is freed, without spinning on event queries.
          lock.unlock();
          retire(inflight, /*block=*/true);
          continue;
        }
        work_cv_.wait(lock, [&] { return !queue_.empty() || (stopping_ && outstanding_ == 0); });
        if (queue_.empty()) break;
        work.swap(queue_);
      }
      for (Item& item : work) process(item, open, inflight);
      work.clear();
      for (Batch& batch : open) issue(batch, inflight);
      while (!inflight.empty() && retire(inflight, /*block=*/false)) {
      }
    } catch (const std::exception& e) {
      // Only allocation failures get here; the records in `work` are lost.
      say(fmt::format("tensortap: the CUDA copier thread failed: {}", e.what()));
      work.clear();
    }
  }
}

void CudaEngine::process(Item& item, std::vector<Batch>& open, std::deque<Batch>& inflight) {
  Batch& batch = open[static_cast<std::size_t>(item.snap.device)];
  // The record's device is current before staging may allocate its pinned
  // buffers: cudaHostAlloc creates a context on the current device, and one
  // on device 0 would cost every process of a multi-GPU job memory there.
  int current = -1;
  if (cudaGetDevice(&current) != cudaSuccess || current != item.snap.device) {
    if (cudaSetDevice(item.snap.device) != cudaSuccess) cudaGetLastError();
  }
  // Every record's own event: records from several threads and streams
  // arrive in any order, so no event stands for another.
  if (item.snap.ready != nullptr) batch.waits.push_back(item.snap.ready);
  if (!item.skip) {
    const std::size_t total = item.snap.nbytes;
    // Larger than a staging buffer: chunks of whole elements.
    const std::size_t unit = total > staging_.capacity() ? item.unit : 0;
    std::size_t offset = 0;
    do {
      Slot slot;
      slot.meta = item.meta;
      slot.record = item.record;
      slot.nbytes = total - offset;
      slot.first = offset == 0;
      std::optional<Staging::Ticket> ticket;
      try {
        ticket = staging_.reserve(slot, /*may_drop=*/false, unit, /*wait=*/false);
        if (!ticket) {
          // The writer takes a buffer only when no copy into it is pending:
          // commit ours before waiting for room.
          for (Batch& b : open) issue(b, inflight);
          retire_all(inflight);
          ticket = staging_.reserve(std::move(slot), /*may_drop=*/false, unit, /*wait=*/true);
          if (!ticket)
            say(fmt::format("tensortap: {} was lost: the writer stopped before it reached host memory",
                                describe(item.meta.get(), item.snap.device)));
        }
      } catch (const std::exception& e) {
        say(fmt::format("tensortap: {} was lost: {}", describe(item.meta.get(), item.snap.device), e.what()));
      }
      if (!ticket) break;
      add_piece(batch, item, *ticket, offset);
      offset += ticket->nbytes;
    } while (offset < total);
  }
  batch.items.push_back(std::move(item));
}

void CudaEngine::add_piece(Batch& batch, const Item& item, const Staging::Ticket& ticket, std::size_t offset) {
  batch.pieces.push_back(Piece{ticket, item.meta.get()});
  if (ticket.nbytes == 0) return;
  const char* src = static_cast<const char*>(item.snap.data) + offset;
  const bool arena = !item.snap.external;
  if (arena && !batch.runs.empty()) {
    Run& last = batch.runs.back();
    // Adjacent in the arena and in the same staging buffer, with the same
    // gap (alignment padding, under 64 bytes): no other slot can lie in a
    // gap that small, so copying it too is harmless.
    const auto s0 = reinterpret_cast<std::uintptr_t>(last.src) + last.nbytes;
    const auto d0 = reinterpret_cast<std::uintptr_t>(last.dst) + last.nbytes;
    const auto s1 = reinterpret_cast<std::uintptr_t>(src);
    const auto d1 = reinterpret_cast<std::uintptr_t>(ticket.dst);
    if (last.mergeable && last.buffer == ticket.buffer && s1 >= s0 && d1 >= d0 && s1 - s0 == d1 - d0 &&
        s1 - s0 < kAlign) {
      last.nbytes += (s1 - s0) + ticket.nbytes;
      return;
    }
  }
  batch.runs.push_back(Run{ticket.dst, src, ticket.nbytes, ticket.buffer, arena});
}

cudaEvent_t CudaEngine::done_event(int device, std::string& error) {
  Device& d = *devices_[static_cast<std::size_t>(device)];
  if (!d.done_events.empty()) {
    cudaEvent_t e = d.done_events.back();
    d.done_events.pop_back();
    return e;
  }
  cudaEvent_t e = nullptr;
  const cudaError_t r = cudaEventCreateWithFlags(&e, cudaEventDisableTiming | cudaEventBlockingSync);
  if (r != cudaSuccess) {
    cudaGetLastError();
    if (error.empty()) error = fmt::format("cannot create a CUDA event on cuda:{}: {}", device, cuda_error_string(r));
    return nullptr;
  }
  events_created_.fetch_add(1, std::memory_order_relaxed);
  return e;
}

void CudaEngine::issue(Batch& batch, std::deque<Batch>& inflight) {
  const int device = batch.device;
  if (batch.empty()) return;
  // Items exist only for devices whose state reserve() created.
  Device& d = *devices_[static_cast<std::size_t>(device)];
  std::string& error = batch.error;
  const auto check = [&](cudaError_t e, const char* what) {
    if (e == cudaSuccess) return;
    cudaGetLastError();
    if (error.empty()) error = fmt::format("{} on cuda:{} failed: {}", what, device, cuda_error_string(e));
  };
  check(cudaSetDevice(device), "cudaSetDevice");
  for (cudaEvent_t e : batch.waits) check(cudaStreamWaitEvent(d.copy_stream, e, 0), "cudaStreamWaitEvent");
  if (error.empty())
    for (const Run& r : batch.runs)
      check(cudaMemcpyAsync(r.dst, r.src, r.nbytes, cudaMemcpyDeviceToHost, d.copy_stream),
            "cudaMemcpyAsync (device to host)");
  batch.done = done_event(device, error);
  if (batch.done != nullptr) {
    const cudaError_t e = cudaEventRecord(batch.done, d.copy_stream);
    if (e != cudaSuccess) {
      check(e, "cudaEventRecord");
      d.done_events.push_back(batch.done);
      batch.done = nullptr;
    }
  }
  if (batch.done == nullptr) {
    // No event tells when the copies end: wait for the copy stream itself
    // (this engine's own stream, never the training stream).
    if (cudaStreamSynchronize(d.copy_stream) != cudaSuccess) cudaGetLastError();
  }
  copies_.fetch_add(error.empty() ? batch.runs.size() : 0, std::memory_order_relaxed);
  inflight.push_back(std::move(batch));
  batch = Batch{};
  batch.device = device;
  if (inflight.size() > kMaxInflight) retire(inflight, /*block=*/true);
}

bool CudaEngine::retire(std::deque<Batch>& inflight, bool block) {
  Batch& b = inflight.front();
  if (b.done != nullptr) {
    const cudaError_t e = block ? cudaEventSynchronize(b.done) : cudaEventQuery(b.done);
    if (!block && e == cudaErrorNotReady) return false;
    if (e != cudaSuccess) {
      cudaGetLastError();
      if (b.error.empty())
        b.error = fmt::format("waiting for the copies on cuda:{} failed: {}", b.device, cuda_error_string(e));
    }
    devices_[static_cast<std::size_t>(b.device)]->done_events.push_back(b.done);
    b.done = nullptr;
  }
  const bool ok = b.error.empty();
  const RecordMeta* reported = nullptr;
  for (const Piece& p : b.pieces) {
    staging_.commit(p.ticket, ok);
    // Once per record: its chunks come one after another.
    if (!ok && p.meta != reported) {
      reported = p.meta;
      say(fmt::format("tensortap: copying {} to the host failed: {}", describe(p.meta, b.device), b.error));
    }
  }
  // Owners free external snapshots before the device's external slot is
  // given to the next one: at most one is ever alive per device.
  for (Item& item : b.items)
    if (item.release) {
      try {
        item.release();
      } catch (...) {
      }
      item.release = nullptr;
    }
  std::uint64_t records = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (const Item& item : b.items) {
      Device& d = *devices_[static_cast<std::size_t>(item.snap.device)];
      if (item.snap.region != 0) free_region(d, item.snap.region);
      if (item.snap.external) d.external_busy = false;
      if (item.snap.ready != nullptr) d.ready_events.push_back(item.snap.ready);
      --d.in_flight;
      if (!item.skip) ++records;
    }
    retired_ += b.items.size();
  }
  records_.fetch_add(records, std::memory_order_relaxed);
  inflight.pop_front();
  room_cv_.notify_all();
  done_cv_.notify_all();
  return true;
}

void CudaEngine::retire_all(std::deque<Batch>& inflight) {
  while (!inflight.empty()) retire(inflight, /*block=*/true);
}

}  // namespace tensortap::detail
