// One event a step (CudaEngineOptions::batch_events, TENSORTAP_CUDA_BATCH=on):
// a stream's snapshots wait, holding their arena room, until the step ends
// (or the arena fills, flush(), a capture on another stream of the device),
// then one event recorded after them hands them to the copier together. The
// training thread then makes one runtime call a snapshot (its copy) and two
// a step (the graph check and the event); the copier one wait a group.

#include "sdk/src/cuda/engine.h"

#include <fmt/format.h>

#include "sdk/src/cuda/device.h"

namespace tensortap::detail {

CudaEngine::Items CudaEngine::take_waiting(Device& d, int device, cudaStream_t& stream, cudaEvent_t& event,
                                           std::string& error) noexcept {
  Items group(std::move(d.waiting));
  stream = d.waiting_stream;
  d.waiting_stream = nullptr;
  event = nullptr;
  if (group.empty()) return group;
  // Until hand_over() has recorded its event: the stream's owner, in
  // end_step(), waits for it before it may destroy the stream.
  ++handing_over_;
  std::vector<cudaEvent_t>& pool = d.cuda->ready_events;
  if (!pool.empty()) {
    event = pool.back();
    pool.pop_back();
    return group;
  }
  // The pool starts with max_records events and a group takes one: only a
  // run with that many groups in flight gets here. Room in the pool first:
  // the copier gives the event back there and must not fail to.
  cudaError_t e = cudaErrorMemoryAllocation;
  try {
    make_event_room(pool, d.ready_total + 1);
    DeviceGuard guard(device);
    e = cudaEventCreateWithFlags(&event, cudaEventDisableTiming);
    if (e != cudaSuccess) cudaGetLastError();
  } catch (...) {
  }
  if (e != cudaSuccess) {
    event = nullptr;
    try {
      error = fmt::format("cannot create a CUDA event on cuda:{}: {}", device, cuda_error_string(e));
    } catch (...) {
    }
    return group;
  }
  ++d.ready_total;
  events_created_.fetch_add(1, std::memory_order_relaxed);
  return group;
}

void CudaEngine::hand_over(Items group, int device, cudaStream_t stream, cudaEvent_t event,
                           std::string error) noexcept {
  if (group.empty()) return;
  if (event != nullptr && error.empty()) {
    // A graph capture begun on the stream since the snapshots were taken
    // would take the event into the graph: the copier could not wait on
    // it. Asked once a group (once a step), as the capture asks once a step.
    cudaStreamCaptureStatus graph = cudaStreamCaptureStatusNone;
    if (cudaStreamIsCapturing(stream, &graph) != cudaSuccess) cudaGetLastError();
    if (graph != cudaStreamCaptureStatusNone) {
      error = "a CUDA graph capture began on its stream after the snapshot, within the step (with "
              "TENSORTAP_CUDA_BATCH=on a graph capture must begin at a step boundary)";
    } else if (const cudaError_t e = cudaEventRecord(event, stream); e != cudaSuccess) {
      cudaGetLastError();
      try {
        error = fmt::format("cannot record a CUDA event after the snapshot: {}", cuda_error_string(e));
      } catch (...) {
      }
    }
  }
  const bool failed = event == nullptr || !error.empty();
  for (Item* item = group.head; item != nullptr; item = item->next) {
    // Every record waits on the group's event; the last gives it back. An
    // event not recorded (a failure) is waited on for nothing, as CUDA does.
    item->snap.ready = event;
    item->owns_ready = item == group.tail;
    if (!failed || item->skip) continue;
    item->skip = true;
    try {
      report_(fmt::format("tensortap: {} was lost: {}", describe(item->desc(), device),
                          error.empty() ? std::string("no CUDA event for it") : error));
    } catch (...) {
    }
  }
  bool wake = false, handed = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    while (Item* item = group.pop()) {
      item->seq = ++submitted_;
      queue_.push(item);
      --outstanding_;
    }
    wake = copier_waiting_;
    handed = --handing_over_ == 0 && handover_waiters_ > 0;
  }
  if (wake) work_cv_.notify_one();
  if (handed) handed_cv_.notify_all();
}

void CudaEngine::hand_over_all() noexcept {
  if (!options_.batch_events) return;
  for (std::size_t i = 0; i < devices_.size(); ++i) {
    cudaStream_t stream = nullptr;
    cudaEvent_t event = nullptr;
    std::string error;
    Items group;
    {
      std::lock_guard<std::mutex> lock(mu_);
      Device& d = *devices_[i];
      if (d.waiting.empty()) continue;
      group = take_waiting(d, static_cast<int>(i), stream, event, error);
    }
    hand_over(std::move(group), static_cast<int>(i), stream, event, std::move(error));
  }
  // A group another thread took (a capture on another stream of the device)
  // may still be having its event recorded on a stream of this thread's:
  // once this returns, nothing of the engine's touches a stream for the
  // snapshots taken before, and its owner may destroy it.
  std::unique_lock<std::mutex> lock(mu_);
  if (handing_over_ == 0) return;
  ++handover_waiters_;
  handed_cv_.wait(lock, [&] { return handing_over_ == 0; });
  --handover_waiters_;
}

void CudaEngine::end_step() noexcept {
  if (!options_.batch_events) return;
  steps_ended_.fetch_add(1, std::memory_order_relaxed);
  hand_over_all();
}

void CudaEngine::wait_for_step(Item* item, cudaStream_t stream) noexcept {
  // With the room it holds, the snapshot joins its stream's group; one on
  // another stream of the device first ends the group there (a group waits
  // on one stream's event). Once stopping, it is handed over at once: no
  // step end may come.
  const int device = item->snap.device;
  Items earlier;
  cudaStream_t earlier_stream = nullptr;
  cudaEvent_t event = nullptr;
  std::string error;
  bool now = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    Device& d = *devices_[static_cast<std::size_t>(device)];
    if (!d.waiting.empty() && d.waiting_stream != stream)
      earlier = take_waiting(d, device, earlier_stream, event, error);
    d.waiting.push(item);
    d.waiting_stream = stream;
    now = stopping_;
  }
  if (!earlier.empty()) hand_over(std::move(earlier), device, earlier_stream, event, std::move(error));
  if (now) hand_over_all();
}

}  // namespace tensortap::detail
