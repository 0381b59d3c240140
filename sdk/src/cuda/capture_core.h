#pragma once

// The training thread's part of a CUDA capture that needs only the CUDA
// runtime: the CUDA-graph check, room in the engine, the snapshot copy, the
// handoff. The LibTorch side (sdk/src/cuda/capture.cpp) finds the device
// and its current stream and gives a `Source`; a benchmark built without
// CUDA LibTorch (bench/bench_cuda_host.cpp, against the fake runtime) gives
// its own, so that what a capture costs the host (allocations, locks,
// runtime calls, instructions) is counted without a GPU (bench/cuda_host_counts.sh).
//
// A Source provides:
//   bool byte_copy() const;          // a plain copy of its bytes is the stored form
//   const void* bytes() const;       // those bytes (device memory), when byte_copy()
//   void copy_into(void* dst, cudaStream_t stream);  // otherwise: the stored form into dst, on stream
//   void* own_snapshot(std::function<void()>& release);  // device memory of its own for a snapshot
//                                    // larger than the arena; `release` frees it (copier thread)
//   std::string describe() const;    // for messages: name, kind, step, dtype and shape

#include <cuda_runtime_api.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <utility>

#include "sdk/src/cuda/device.h"
#include "sdk/src/cuda/engine.h"
#include "sdk/src/core/record.h"
#include "writers/src/check.h"
#include "writers/src/dtypes.h"

namespace tensortap::detail {

/// Counts a CUDA capture queued; `counted_cuda_captures()` is the count
/// (cuda_captures()). In engine.cpp, which the benchmark links too.
void count_cuda_capture() noexcept;
std::uint64_t counted_cuda_captures() noexcept;

/// Whether this thread must ask whether `stream` is being captured into a
/// CUDA graph before a snapshot on it: always, but with the engine's
/// batch_events only once a step per thread and stream (the steps the
/// engine has ended tell a new step; a graph capture must then begin at a
/// step boundary, docs/recording.md).
inline bool graph_check_due(const CudaEngine& engine, cudaStream_t stream) {
  if (!engine.batch_events()) return true;
  thread_local const CudaEngine* t_engine = nullptr;
  thread_local std::uint64_t t_engine_id = 0;
  thread_local cudaStream_t t_stream = nullptr;
  thread_local std::uint64_t t_steps = 0;
  const std::uint64_t steps = engine.steps_ended();
  if (t_engine == &engine && t_engine_id == engine.id() && t_stream == stream && t_steps == steps) return false;
  t_engine = &engine;
  t_engine_id = engine.id();
  t_stream = stream;
  t_steps = steps;
  return true;
}

/// Captures `source` as the record `spec` describes, on `device` in order
/// on `stream` (the device's current stream; the device is current): see
/// `cuda_capture` (sdk/src/cuda/capture.h) for the contract.
template <class Source>
bool capture_on_engine(CudaEngine& engine, const RecordSpec& spec, int device, cudaStream_t stream, Source& source,
                       bool may_drop) {
  const auto nbytes = static_cast<std::size_t>(spec.nbytes);
  // Inside CUDA graph capture, the snapshot copy and the event would become
  // part of the graph instead of running now.
  if (graph_check_due(engine, stream)) {
    cudaStreamCaptureStatus graph = cudaStreamCaptureStatusNone;
    if (cudaStreamIsCapturing(stream, &graph) != cudaSuccess) cudaGetLastError();
    if (graph != cudaStreamCaptureStatusNone)
      fail("cannot capture {} while its stream is being captured into a CUDA graph", source.describe());
  }

  std::optional<CudaEngine::Snapshot> snap;
  try {
    snap = engine.reserve(device, nbytes, may_drop);
  } catch (const std::exception& e) {
    fail("cannot capture {}: {}", source.describe(), e.what());
  }
  if (!snap) return false;

  // A tensor larger than the engine's arena gets a snapshot of its own,
  // held until its copy to the host is done and freed then, on the copier
  // thread.
  std::function<void()> release;
  try {
    if (nbytes > 0) {
      if (snap->external) snap->data = source.own_snapshot(release);
      if (source.byte_copy()) {
        // Cheaper for the training thread than ATen's dispatch and
        // TensorIterator, and what most captures (contiguous float32) take.
        const cudaError_t e = cudaMemcpyAsync(snap->data, source.bytes(), nbytes, cudaMemcpyDeviceToDevice, stream);
        if (e != cudaSuccess) {
          cudaGetLastError();
          fail("cudaMemcpyAsync (device to device, {} bytes) failed: {}", nbytes, cuda_error_string(e));
        }
      } else {
        source.copy_into(snap->data, stream);
      }
    }
  } catch (const std::exception& e) {
    engine.cancel(*snap, stream, std::move(release));
    fail("cannot snapshot {} on its device: {}", source.describe(), e.what());
  }
  engine.submit(*snap, stream, spec, element_size(spec.dtype.element), std::move(release));
  count_cuda_capture();
  return true;
}

}  // namespace tensortap::detail
