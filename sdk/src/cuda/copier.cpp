// The CUDA engine's copier thread: waits for each record's event, copies
// runs of records into host staging with one cudaMemcpyAsync each, and
// commits them when the copies complete. Nothing here throws out of run().

#include "sdk/src/cuda/engine.h"
#include "sdk/src/core/process.h"

#include <fmt/format.h>

namespace tensortap::detail {

namespace {

// Room for `n` more elements ahead of time (doubling), so that the
// push_back that follows cannot throw.
template <typename T>
void make_room(std::vector<T>& v, std::size_t n) {
  const std::size_t need = v.size() + n;
  if (v.capacity() < need) v.reserve(std::max(need, 2 * v.capacity()));
}

}  // namespace

template <typename... Args>
void CudaEngine::report_nothrow(fmt::format_string<Args...> format, Args&&... args) noexcept {
  try {
    report_(fmt::format(format, std::forward<Args>(args)...));
  } catch (...) {
  }
}

void CudaEngine::run(int device) noexcept {
  mark_background_thread();
  // A new thread's current device is 0: the first runtime call below would
  // create a context there, which on a DDP rank of another GPU costs that
  // GPU memory in every process.
  if (use_device(device) != cudaSuccess) cudaGetLastError();
  // A user capturing a CUDA graph in the default (global) mode would have
  // the capture invalidated by this thread's event queries, copies and
  // syncs; in thread-local mode they are this thread's own business, as
  // PyTorch made its NCCL watchdog's.
  cudaStreamCaptureMode mode = cudaStreamCaptureModeThreadLocal;
  if (cudaThreadExchangeStreamCaptureMode(&mode) != cudaSuccess) cudaGetLastError();
  for (;;) {
    try {
      {
        std::unique_lock<std::mutex> lock(mu_);
        if (queue_.empty() && !inflight_.empty()) {
          // Nothing new: finish what is in flight, so flush() returns and
          // the room is freed, without spinning on event queries.
          lock.unlock();
          retire(/*block=*/true);
          continue;
        }
        copier_waiting_ = true;
        work_cv_.wait(lock, [&] { return !queue_.empty() || (stopping_ && outstanding_ == 0); });
        copier_waiting_ = false;
        if (queue_.empty()) break;
        work_.splice(queue_);
        taken_ = submitted_;
      }
      while (!work_.empty()) process(*work_.head);
      for (Batch& batch : open_) issue(batch);
      // With nothing new queued, the loop's top waits for the oldest batch
      // at once: an event query first would be a runtime call for nothing
      // (one a step, with one event a step).
      bool more = false;
      {
        std::lock_guard<std::mutex> lock(mu_);
        more = !queue_.empty();
      }
      while (more && !inflight_.empty() && retire(/*block=*/false)) {
      }
    } catch (const std::exception& e) {
      abandon(e.what());
    } catch (...) {
      abandon("an unknown exception");
    }
  }
}

cudaError_t CudaEngine::use_device(int device) {
  // A device query and a set a record were 127 of the copier's 142 runtime
  // calls a step of 64 captures (bench/cuda_host_counts.sh).
  if (device == copier_device_) return cudaSuccess;
  const cudaError_t e = cudaSetDevice(device);
  copier_device_ = e == cudaSuccess ? device : -1;
  return e;
}

void CudaEngine::process(Item& item) {
  Batch& batch = open_[static_cast<std::size_t>(item.snap.device)];
  // The record's device is current before staging may allocate its pinned
  // buffers: cudaHostAlloc creates a context on the current device, and one
  // on device 0 would cost every process of a multi-GPU job memory there.
  if (use_device(item.snap.device) != cudaSuccess) cudaGetLastError();
  if (!staging_moved_) {
    // Once, here rather than under the staging's lock on whichever thread
    // reserved first: CPU captures and the writer never wait for the
    // pinning, and a run without CUDA records never pins.
    staging_moved_ = true;
    staging_.adopt(options_.staging_memory);
  }
  // Every record's own event: records from several threads and streams
  // arrive in any order, so no event stands for another.
  make_room(batch.waits, 1);
  // A step's group shares one event (batch_events): waited on once.
  if (item.snap.ready != nullptr && (batch.waits.empty() || batch.waits.back() != item.snap.ready))
    batch.waits.push_back(item.snap.ready);
  if (!item.skip) {
    const std::size_t total = item.snap.nbytes;
    // Larger than a staging buffer: chunks of whole elements.
    const std::size_t unit = total > staging_.capacity() ? item.unit : 0;
    std::size_t offset = 0;
    do {
      const RecordSpec spec = RecordSpec::of(*item.record, item.id);
      // The batch (issued or not) may be another by the time the ticket
      // comes: room in this one now, and again after an issue.
      make_room(batch.pieces, 1);
      make_room(batch.copies, 1);
      // Staging's failures (no memory for a buffer) lose this record only.
      bool lost = false;
      const auto reserve = [&](bool wait) -> std::optional<Staging::Ticket> {
        try {
          return staging_.reserve(spec, total - offset, offset == 0, /*may_drop=*/false, unit, wait);
        } catch (const std::exception& e) {
          lost = true;
          report_nothrow("tensortap: {} was lost: {}", describe(item.desc(), item.snap.device), e.what());
          return std::nullopt;
        }
      };
      std::optional<Staging::Ticket> ticket = reserve(/*wait=*/false);
      if (!ticket && !lost) {
        // The writer takes a buffer only when no copy into it is pending:
        // commit ours before waiting for room.
        for (Batch& b : open_) issue(b);
        retire_all();
        make_room(batch.pieces, 1);
        make_room(batch.copies, 1);
        ticket = reserve(/*wait=*/true);
        if (!ticket && !lost)
          report_nothrow("tensortap: {} was lost: the writer stopped before it reached host memory",
                         describe(item.desc(), item.snap.device));
      }
      if (!ticket) break;
      add_piece(batch, item, *ticket, offset);
      offset += ticket->nbytes;
    } while (offset < total);
  }
  batch.items.push(work_.pop());
}

void CudaEngine::add_piece(Batch& batch, const Item& item, const Staging::Ticket& ticket, std::size_t offset) noexcept {
  batch.pieces.push_back(Piece{ticket, item.desc()});
  if (ticket.nbytes == 0) return;
  const char* src = static_cast<const char*>(item.snap.data) + offset;
  const bool arena = !item.snap.external;
  if (arena && !batch.copies.empty()) {
    Copy& last = batch.copies.back();
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
  batch.copies.push_back(Copy{ticket.dst, src, ticket.nbytes, ticket.buffer, arena});
}

cudaEvent_t CudaEngine::done_event(int device, std::string& error) {
  Device& dev = *devices_[static_cast<std::size_t>(device)];
  std::vector<cudaEvent_t>& pool = dev.cuda->done_events;
  if (!pool.empty()) {
    cudaEvent_t e = pool.back();
    pool.pop_back();
    return e;
  }
  // Room in the pool first: retiring the batch gives the event back there.
  make_room(pool, dev.done_total + 1 - pool.size());
  cudaEvent_t e = nullptr;
  const cudaError_t r = cudaEventCreateWithFlags(&e, cudaEventDisableTiming | cudaEventBlockingSync);
  if (r != cudaSuccess) {
    cudaGetLastError();
    if (error.empty()) error = fmt::format("cannot create a CUDA event on cuda:{}: {}", device, cuda_error_string(r));
    return nullptr;
  }
  ++dev.done_total;
  events_created_.fetch_add(1, std::memory_order_relaxed);
  return e;
}

void CudaEngine::issue(Batch& batch) {
  const int device = batch.device;
  if (batch.empty()) return;
  // Items exist only for devices whose state reserve() created.
  DeviceResources& d = *devices_[static_cast<std::size_t>(device)]->cuda;
  std::string& error = batch.error;
  const auto check = [&](cudaError_t e, const char* what) {
    if (e == cudaSuccess) return;
    cudaGetLastError();
    if (error.empty()) error = fmt::format("{} on cuda:{} failed: {}", what, device, cuda_error_string(e));
  };
  check(use_device(device), "cudaSetDevice");
  for (cudaEvent_t e : batch.waits) check(cudaStreamWaitEvent(d.copy_stream, e, 0), "cudaStreamWaitEvent");
  if (error.empty())
    for (const Copy& r : batch.copies)
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
  copies_.fetch_add(error.empty() ? batch.copies.size() : 0, std::memory_order_relaxed);
  inflight_.push_back(std::move(batch));
  batch = Batch{};
  batch.device = device;
  if (inflight_.size() > kMaxInflight) retire(/*block=*/true);
}

bool CudaEngine::retire(bool block) noexcept {
  Batch& b = inflight_.front();
  if (b.done != nullptr) {
    const cudaError_t e = block ? cudaEventSynchronize(b.done) : cudaEventQuery(b.done);
    if (!block && e == cudaErrorNotReady) return false;
    if (e != cudaSuccess) {
      cudaGetLastError();
      if (b.error.empty()) {
        try {
          b.error = fmt::format("waiting for the copies on cuda:{} failed: {}", b.device, cuda_error_string(e));
        } catch (...) {
          b.error = "waiting for the copies failed";
        }
      }
    }
    // Never reallocates: the pool has room for every event of the device.
    devices_[static_cast<std::size_t>(b.device)]->cuda->done_events.push_back(b.done);
    b.done = nullptr;
  }
  finish(b);
  inflight_.pop_front();
  {
    std::lock_guard<std::mutex> lock(mu_);
    update_retired();
  }
  room_cv_.notify_all();
  done_cv_.notify_all();
  return true;
}

void CudaEngine::retire_all() noexcept {
  while (!inflight_.empty()) retire(/*block=*/true);
}

void CudaEngine::finish(Batch& b, const char* failure) noexcept {
  const bool ok = b.error.empty() && failure == nullptr;
  const char* why = failure != nullptr ? failure : b.error.c_str();
  const RecordDesc* reported = nullptr;
  for (const Piece& p : b.pieces) {
    staging_.commit(p.ticket, ok);
    // Once per record: its chunks come one after another.
    if (!ok && p.desc != reported) {
      reported = p.desc;
      report_nothrow("tensortap: copying {} to the host failed: {}", describe(p.desc, b.device), why);
    }
  }
  b.pieces.clear();
  free_items(b.items);
}

void CudaEngine::free_items(Items& items) noexcept {
  // Owners free external snapshots before their bytes go back to the
  // device's budget: what is alive never exceeds it.
  for (Item* item = items.head; item != nullptr; item = item->next)
    if (item->release) {
      try {
        item->release();
      } catch (...) {
      }
      item->release = nullptr;
    }
  std::uint64_t records = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    while (Item* item = items.pop()) {
      Device& d = *devices_[static_cast<std::size_t>(item->snap.device)];
      if (item->snap.region != 0) d.ring.free(item->snap.region);
      if (item->snap.external) d.large_held -= item->snap.nbytes;
      // Never reallocates: the pool has room for every event of the device.
      if (item->snap.ready != nullptr && item->owns_ready) d.cuda->ready_events.push_back(item->snap.ready);
      --d.in_flight;
      if (!item->skip) ++records;
      // Back to the pool: the record's strings keep their memory for the
      // next; what the caller gave is let go now.
      item->record = nullptr;
      item->release = nullptr;
      item->skip = false;
      item->owns_ready = true;
      item->snap = Snapshot{};
      pool_.push(item);
    }
  }
  records_.fetch_add(records, std::memory_order_relaxed);
}

void CudaEngine::update_retired() noexcept {
  // Every list the copier holds is in submission order, so its head is its
  // oldest record; records not taken yet are newer than all of them.
  std::uint64_t oldest = taken_ + 1;
  const auto consider = [&](const Items& items) {
    if (!items.empty()) oldest = std::min(oldest, items.head->seq);
  };
  consider(work_);
  for (const Batch& b : open_) consider(b.items);
  for (const Batch& b : inflight_) consider(b.items);
  retired_ = oldest - 1;
}

void CudaEngine::abandon(const char* why) noexcept {
  // Batches in flight were issued whole: they complete as usual.
  retire_all();
  Items dropped;
  for (Batch& b : open_) {
    if (b.empty()) continue;
    DeviceResources& d = *devices_[static_cast<std::size_t>(b.device)]->cuda;
    // The batch may be partly issued, and its snapshots' copies into the
    // arena still running: nothing of it is freed before they end (the
    // copier's own wait, never the training thread's).
    for (cudaEvent_t e : b.waits)
      if (cudaEventSynchronize(e) != cudaSuccess) cudaGetLastError();
    if (cudaStreamSynchronize(d.copy_stream) != cudaSuccess) cudaGetLastError();
    if (b.done != nullptr) d.done_events.push_back(b.done);
    b.done = nullptr;
    b.waits.clear();
    b.copies.clear();
    // Its pieces are committed as failed (each record reported) and its
    // records freed.
    finish(b, b.error.empty() ? why : nullptr);
    b.error.clear();
  }
  // Records not processed yet (the first one perhaps in part): none has a
  // copy on the copy stream, but its snapshot may still be being taken.
  std::uint64_t lost = 0;
  while (Item* item = work_.pop()) {
    if (item->snap.ready != nullptr && cudaEventSynchronize(item->snap.ready) != cudaSuccess) cudaGetLastError();
    if (!item->skip) {
      ++lost;
      report_nothrow("tensortap: {} was lost: the CUDA copier thread failed: {}",
                     describe(item->desc(), item->snap.device), why);
      item->skip = true;  // not among the records that reached staging
    }
    dropped.push(item);
  }
  dropped_.fetch_add(lost, std::memory_order_relaxed);
  free_items(dropped);
  {
    std::lock_guard<std::mutex> lock(mu_);
    update_retired();
  }
  room_cv_.notify_all();
  done_cv_.notify_all();
}

}  // namespace tensortap::detail
