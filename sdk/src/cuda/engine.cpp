// The training-thread side of the CUDA engine: reservations, submissions
// and the device state they create. The copier thread is copier.cpp.

#include "sdk/src/cuda/engine.h"

#include <algorithm>
#include <cstdio>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "sdk/src/cuda/capture_core.h"
#include "writers/src/check.h"
#include "writers/src/dtypes.h"

namespace tensortap::detail {
namespace {

std::size_t align_up(std::size_t n, std::size_t a) { return (n + a - 1) / a * a; }

}  // namespace

void CudaEngine::make_event_room(std::vector<cudaEvent_t>& pool, std::size_t n) {
  if (pool.capacity() < n) pool.reserve(std::max(n, 2 * pool.capacity()));
}

CudaEngine::Items& CudaEngine::Items::operator=(Items&& o) noexcept {
  head = o.head;
  tail = o.tail;
  o.head = o.tail = nullptr;
  return *this;
}

void CudaEngine::Items::push(Item* item) noexcept {
  item->next = nullptr;
  if (tail != nullptr)
    tail->next = item;
  else
    head = item;
  tail = item;
}

CudaEngine::Item* CudaEngine::Items::pop() noexcept {
  Item* item = head;
  if (item == nullptr) return nullptr;
  head = item->next;
  if (head == nullptr) tail = nullptr;
  item->next = nullptr;
  return item;
}

void CudaEngine::Items::splice(Items& other) noexcept {
  if (other.head == nullptr) return;
  if (tail != nullptr)
    tail->next = other.head;
  else
    head = other.head;
  tail = other.tail;
  other.head = other.tail = nullptr;
}

std::string CudaEngine::describe(const RecordDesc* meta, int device) {
  if (meta == nullptr) return fmt::format("a record on cuda:{}", device);
  return fmt::format("'{}' (kind {}, step {}, {} [{}], cuda:{})", meta->name, kind_name(meta->kind), meta->step,
                     meta->dtype.name, fmt::join(meta->shape, ", "), device);
}

namespace {
std::atomic<std::uint64_t> g_engines{0};
}  // namespace

CudaEngine::CudaEngine(Staging& staging, CudaEngineOptions options, Report report)
    : staging_(staging), options_(options), report_(std::move(report)), id_(g_engines.fetch_add(1) + 1) {
  TENSORTAP_CHECK(options_.max_records >= 1, "CudaEngineOptions::max_records({}) must be at least 1",
                  options_.max_records);
  const int n = cuda_device_count();
  devices_.reserve(static_cast<std::size_t>(n));
  for (int i = 0; i < n; ++i) devices_.push_back(std::make_unique<Device>());
  open_.resize(devices_.size());
  for (std::size_t i = 0; i < open_.size(); ++i) open_[i].device = static_cast<int>(i);
}

CudaEngine::~CudaEngine() {
  stop();
  while (Item* item = pool_.pop()) delete item;
}

void CudaEngine::warn(const std::string& what) noexcept {
  try {
    if (options_.warn)
      options_.warn(what);
    else
      std::fprintf(stderr, "%s\n", what.c_str());
  } catch (...) {
  }
}

std::optional<CudaEngine::Snapshot> CudaEngine::reserve(int device, std::size_t nbytes, bool may_drop) {
  TENSORTAP_CHECK(device >= 0 && static_cast<std::size_t>(device) < devices_.size(),
                  "no CUDA device cuda:{} (the CUDA runtime sees {} device(s))", device, devices_.size());
  std::unique_lock<std::mutex> lock(mu_);
  // The record's queue entry, now: once the room is taken, submit() and
  // cancel() must be able to queue it without allocating. From the pool; a
  // new one while more records are in flight than ever before.
  std::unique_ptr<Item> item(pool_.pop());
  if (!item) item = std::make_unique<Item>();
  // Back to the pool on every way out that takes no room.
  struct Keep {
    Items& pool;
    std::unique_ptr<Item>& item;
    ~Keep() {
      if (item) pool.push(item.release());
    }
  } keep{pool_, item};
  Device& d = *devices_[static_cast<std::size_t>(device)];
  for (;;) {
    if (stopping_) return std::nullopt;
    if (d.cuda == nullptr) open_device(d, device);
    if (!thread_.joinable()) thread_ = std::thread([this, device] { run(device); });
    Snapshot snap;
    snap.device = device;
    snap.nbytes = nbytes;
    std::optional<RingAllocator::Region> region;
    if (place(d, snap, region)) {
      // batch_events: the event comes when the snapshot is handed over.
      if (!options_.batch_events) take_event(d, snap, region);
      if (snap.external) {
        d.large_held += nbytes;
      } else if (region) {
        snap.region = region->id;
        snap.data = d.cuda->arena + region->offset;
      }
      ++d.in_flight;
      ++outstanding_;
      snap.item = item.release();
      return snap;
    }
    if (!d.waiting.empty()) {
      // batch_events: a full arena ends the snapshots' group early (one
      // event after those so far), so the copier can free their room; then
      // this one is tried again.
      cudaStream_t stream = nullptr;
      cudaEvent_t event = nullptr;
      std::string error;
      Items group = take_waiting(d, device, stream, event, error);
      lock.unlock();
      hand_over(std::move(group), device, stream, event, std::move(error));
      lock.lock();
      continue;
    }
    if (may_drop) {
      refused_.fetch_add(1, std::memory_order_relaxed);
      return std::nullopt;
    }
    room_cv_.wait(lock);
  }
}

void CudaEngine::open_device(Device& d, int device) {
  if (!d.error.empty()) fail("{}", d.error);
  // The events the device usually needs, now: a pool of record events,
  // one completion event per batch in flight.
  const std::size_t arena = options_.device_bytes / kAlign * kAlign;
  try {
    d.cuda = std::make_unique<DeviceResources>(device, arena + (options_.batch_events ? kCounterBytes : 0),
                                               options_.arena_memory, options_.max_records, kMaxInflight + 1,
                                               events_created_);
  } catch (const std::exception& e) {
    // Kept without fail()'s prefix, which fail() adds again below.
    d.error = e.what();
    const std::string prefix = "tensortap: ";
    if (d.error.compare(0, prefix.size(), prefix) == 0) d.error.erase(0, prefix.size());
    throw;
  }
  // Once per device, never retried: a failed allocation from torch's
  // allocator frees its whole cache first, which on every capture
  // would cost the training more than the snapshots do.
  if (d.cuda->arena == nullptr && arena > 0)
    warn(fmt::format(
        "tensortap: warning: cannot allocate {} bytes on cuda:{} for tensor snapshots ({}); its snapshots are "
        "allocated one by one instead",
        arena, device, d.cuda->arena_error));
  d.ring = RingAllocator(d.cuda->arena != nullptr ? arena : 0);
  // batch_events: the counter slots, past the ring's end (the arena is
  // allocated that much larger), zeroed once here, at the first capture's
  // warm-up; a batch's launch leaves its slot zero again.
  if (d.cuda->arena != nullptr && options_.batch_events) {
    unsigned* counters = reinterpret_cast<unsigned*>(d.cuda->arena + arena);
    if (cudaMemset(counters, 0, kCounterBytes) == cudaSuccess) {
      d.counters = counters;
      d.free_counters.reserve(kCounterSlots);
      for (std::size_t i = 0; i < kCounterSlots; ++i) d.free_counters.push_back(counters + i * kCounterSlot);
    } else {
      cudaGetLastError();
    }
  }
  d.ready_total = d.cuda->ready_events.size();
  d.done_total = d.cuda->done_events.size();
}

bool CudaEngine::place(Device& d, Snapshot& snap, std::optional<RingAllocator::Region>& region) {
  // The arena bounds what snapshots hold; the number of records in flight
  // is not bounded: a step with more captures than the event pool holds
  // creates events rather than waiting for copies (a wait there would
  // stall the training thread).
  if (snap.nbytes == 0) return true;
  if (align_up(snap.nbytes, kAlign) > d.ring.capacity()) {
    // The caller allocates it, within the byte budget: several fit when
    // they are small enough, and a step's second large tensor does not
    // wait for the first one's copy. One over the budget alone still
    // goes, by itself.
    snap.external = true;
    return d.large_held == 0 || d.large_held + snap.nbytes <= options_.large_bytes;
  }
  region = d.ring.allocate(align_up(snap.nbytes, kAlign));
  return region.has_value();
}

void CudaEngine::take_event(Device& d, Snapshot& snap, const std::optional<RingAllocator::Region>& region) {
  if (snap.nbytes == 0) return;
  // Pooled: max_records of them come with the arena; when more records are
  // in flight, new ones join the pool once they retire.
  std::vector<cudaEvent_t>& pool = d.cuda->ready_events;
  if (!pool.empty()) {
    snap.ready = pool.back();
    pool.pop_back();
    return;
  }
  // Room in the pool first: the copier gives the event back there and
  // must not fail to.
  cudaError_t e = cudaErrorMemoryAllocation;
  try {
    make_event_room(pool, d.ready_total + 1);
    DeviceGuard guard(snap.device);
    e = cudaEventCreateWithFlags(&snap.ready, cudaEventDisableTiming);
    if (e != cudaSuccess) cudaGetLastError();
  } catch (...) {
  }
  if (e != cudaSuccess) {
    if (region) d.ring.free(region->id);
    fail("cannot create a CUDA event on cuda:{}: {}", snap.device, cuda_error_string(e));
  }
  ++d.ready_total;
  events_created_.fetch_add(1, std::memory_order_relaxed);
}

void CudaEngine::enqueue(Item* item) noexcept {
  bool wake = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    item->seq = ++submitted_;
    queue_.push(item);
    --outstanding_;
    wake = copier_waiting_;
  }
  if (wake) work_cv_.notify_one();
}

void CudaEngine::submit(Snapshot snap, cudaStream_t stream, const RecordSpec& spec, std::size_t unit,
                        std::function<void()> release) {
  TENSORTAP_CHECK(snap.item != nullptr, "CudaEngine::submit() of a snapshot that reserve() did not return");
  Item* item = snap.item;
  // Nothing before enqueue() may throw: the reservation must reach the
  // copier, which gives the room back, or stop() would wait for it forever.
  // The name is copied into the entry's, which allocates only when it is
  // longer than any this entry held before.
  bool no_record = false;
  try {
    item->own.assign(spec);
    item->record = &item->own;
  } catch (...) {
    no_record = true;
    item->record = nullptr;
  }
  item->id = spec.id;
  item->snap = snap;
  item->unit = std::max<std::size_t>(unit, 1);
  item->release = std::move(release);
  const bool no_memory = snap.nbytes > 0 && snap.data == nullptr;
  if (options_.batch_events) {
    item->skip = no_record || no_memory;
    wait_for_step(item, stream);
    if (no_record) fail("no host memory for the record of '{}' (kind {}, step {})", spec.name, kind_name(spec.kind), spec.step);
    if (no_memory) fail("no snapshot memory for '{}' (kind {}, step {})", spec.name, kind_name(spec.kind), spec.step);
    return;
  }
  cudaError_t recorded = cudaSuccess;
  if (!no_memory && !no_record && snap.ready != nullptr) {
    recorded = cudaEventRecord(snap.ready, stream);
    if (recorded != cudaSuccess) cudaGetLastError();
  }
  const bool failed = no_record || no_memory || recorded != cudaSuccess;
  item->skip = failed;
  enqueue(item);
  // The entry may be the copier's again by now: messages from `spec`.
  if (failed) {
    const std::string what = fmt::format("'{}' (kind {}, step {}, cuda:{})", spec.name, kind_name(spec.kind),
                                         spec.step, snap.device);
    if (no_record) fail("no host memory for the record of {}", what);
    if (no_memory) fail("no snapshot memory for {}", what);
    fail("cannot record a CUDA event after the snapshot of {}: {}", what, cuda_error_string(recorded));
  }
}

void CudaEngine::cancel(Snapshot snap, cudaStream_t stream, std::function<void()> release) noexcept {
  Item* item = snap.item;
  if (item == nullptr) return;  // not a reservation: nothing to give back
  item->snap = snap;
  item->skip = true;
  item->release = std::move(release);
  // Part of the copy may have been enqueued: the room is reused only once
  // the stream is past it (batch_events: past the group's event).
  if (options_.batch_events) return wait_for_step(item, stream);
  if (snap.ready != nullptr && cudaEventRecord(snap.ready, stream) != cudaSuccess) cudaGetLastError();
  enqueue(item);
}

unsigned* CudaEngine::take_counters(int device) noexcept {
  if (device < 0 || static_cast<std::size_t>(device) >= devices_.size()) return nullptr;
  std::lock_guard<std::mutex> lock(mu_);
  Device& d = *devices_[static_cast<std::size_t>(device)];
  if (d.free_counters.empty()) return nullptr;
  unsigned* slot = d.free_counters.back();
  d.free_counters.pop_back();
  return slot;
}

void CudaEngine::give_counters(unsigned* slot) noexcept {
  if (slot == nullptr) return;
  std::lock_guard<std::mutex> lock(mu_);
  // Its device: the one whose slots hold it (a device or two: no map).
  for (auto& d : devices_)
    if (d->counters != nullptr && slot >= d->counters && slot < d->counters + kCounterSlots * kCounterSlot) {
      d->free_counters.push_back(slot);
      return;
    }
}

void CudaEngine::flush() {
  hand_over_all();
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
  // Snapshots waiting for a step's end: none comes now. One submitted
  // after this sees stopping_ and is handed over by its submit().
  hand_over_all();
  work_cv_.notify_all();
  room_cv_.notify_all();
  // No reservation starts the thread once stopping_ is set.
  if (thread_.joinable()) thread_.join();
  std::lock_guard<std::mutex> lock(mu_);
  stopped_ = true;
  for (auto& d : devices_) d->cuda.reset();
}

namespace {
std::atomic<std::uint64_t> g_captures{0};
}  // namespace

void count_cuda_capture() noexcept { g_captures.fetch_add(1, std::memory_order_relaxed); }
std::uint64_t counted_cuda_captures() noexcept { return g_captures.load(std::memory_order_relaxed); }

CudaEngineCounters CudaEngine::counters() const {
  CudaEngineCounters c;
  c.records = records_.load(std::memory_order_relaxed);
  c.copies = copies_.load(std::memory_order_relaxed);
  c.refused = refused_.load(std::memory_order_relaxed);
  c.events_created = events_created_.load(std::memory_order_relaxed);
  c.dropped = dropped_.load(std::memory_order_relaxed);
  return c;
}

}  // namespace tensortap::detail
