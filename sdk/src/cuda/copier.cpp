// The CUDA engine's copier thread: waits for each record's event, copies
// runs of records into host staging with one cudaMemcpyAsync each, and
// commits them when the copies complete. Nothing here throws out of run().

#include "sdk/src/cuda/engine.h"

#include <fmt/format.h>

namespace tensortap::detail {

void CudaEngine::report_nothrow(const std::string& what) noexcept {
  try {
    report_(what);
  } catch (...) {
  }
}

void CudaEngine::run() noexcept {
  // A user capturing a CUDA graph in the default (global) mode would have
  // the capture invalidated by this thread's event queries, copies and
  // syncs; in thread-local mode they are this thread's own business, as
  // PyTorch made its NCCL watchdog's.
  cudaStreamCaptureMode mode = cudaStreamCaptureModeThreadLocal;
  if (cudaThreadExchangeStreamCaptureMode(&mode) != cudaSuccess) cudaGetLastError();
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
      report_nothrow(fmt::format("tensortap: the CUDA copier thread failed: {}", e.what()));
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
      slot.record = *item.record;
      slot.id = item.id;
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
            report_nothrow(fmt::format("tensortap: {} was lost: the writer stopped before it reached host memory",
                                       describe(item.desc(), item.snap.device)));
        }
      } catch (const std::exception& e) {
        report_nothrow(fmt::format("tensortap: {} was lost: {}", describe(item.desc(), item.snap.device), e.what()));
      }
      if (!ticket) break;
      add_piece(batch, item, *ticket, offset);
      offset += ticket->nbytes;
    } while (offset < total);
  }
  batch.items.push_back(std::move(item));
}

void CudaEngine::add_piece(Batch& batch, const Item& item, const Staging::Ticket& ticket, std::size_t offset) {
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
  std::vector<cudaEvent_t>& pool = devices_[static_cast<std::size_t>(device)]->cuda->done_events;
  if (!pool.empty()) {
    cudaEvent_t e = pool.back();
    pool.pop_back();
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
  DeviceResources& d = *devices_[static_cast<std::size_t>(device)]->cuda;
  std::string& error = batch.error;
  const auto check = [&](cudaError_t e, const char* what) {
    if (e == cudaSuccess) return;
    cudaGetLastError();
    if (error.empty()) error = fmt::format("{} on cuda:{} failed: {}", what, device, cuda_error_string(e));
  };
  check(cudaSetDevice(device), "cudaSetDevice");
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
    devices_[static_cast<std::size_t>(b.device)]->cuda->done_events.push_back(b.done);
    b.done = nullptr;
  }
  const bool ok = b.error.empty();
  const RecordDesc* reported = nullptr;
  for (const Piece& p : b.pieces) {
    staging_.commit(p.ticket, ok);
    // Once per record: its chunks come one after another.
    if (!ok && p.desc != reported) {
      reported = p.desc;
      report_nothrow(fmt::format("tensortap: copying {} to the host failed: {}", describe(p.desc, b.device), b.error));
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
      if (item.snap.region != 0) d.ring.free(item.snap.region);
      if (item.snap.external) d.external_busy = false;
      if (item.snap.ready != nullptr) d.cuda->ready_events.push_back(item.snap.ready);
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
