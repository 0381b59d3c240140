#pragma once

// What the CUDA engine holds on each device, and the runtime helpers it and
// the pinned host memory share. CUDA runtime API only, like the engine.

#include <cuda_runtime_api.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace tensortap::detail {

/// How many CUDA devices the runtime sees: 0 when there is no device or no
/// driver (the runtime library loads without one).
int cuda_device_count() noexcept;

/// "cudaErrorMemoryAllocation: out of memory", for messages.
std::string cuda_error_string(cudaError_t error);

/// Makes `device` current on this thread for the guard's lifetime. The
/// training thread's current device is LibTorch's business: it is restored.
class DeviceGuard {
 public:
  explicit DeviceGuard(int device);
  ~DeviceGuard();
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int previous_ = -1;
};

/// Where the engine's arenas come from. The default (both empty) is
/// cudaMalloc and cudaFree; the LibTorch glue passes torch's caching
/// allocator, so that the arena counts in torch's accounting and its memory
/// fraction, comes out of what torch has cached, and is freed without a
/// device synchronization.
struct DeviceMemory {
  /// `bytes` on `device`, which is current while it runs. Throws (or
  /// returns null) when there is no memory.
  std::function<void*(int device, std::size_t bytes)> allocate;
  /// Gives back what `allocate` returned, once nothing uses it. Must not
  /// throw.
  std::function<void(int device, void* data)> release;
};

/// One device's share of the engine: the arena that snapshots are copied
/// into, the copy stream, and the pooled events. Created all at once, when
/// the device gets its first snapshot, so that capturing never allocates
/// after that; freed all at once by the destructor, whether the engine
/// stops or the creation itself failed part way.
class DeviceResources {
 public:
  /// Creates a copy stream, `ready_count` record events and `done_count`
  /// completion events on `device`, adding the events made to
  /// `events_created`, and `arena_bytes` of device memory from `memory`
  /// (none for 0). Throws `Error` naming the device when the stream or the
  /// events cannot be created, once what was created is freed. An arena
  /// that cannot be allocated is not an error: `arena` is null and
  /// `arena_error` says why.
  DeviceResources(int device, std::size_t arena_bytes, DeviceMemory memory, std::size_t ready_count,
                  std::size_t done_count, std::atomic<std::uint64_t>& events_created);
  ~DeviceResources();
  DeviceResources(const DeviceResources&) = delete;
  DeviceResources& operator=(const DeviceResources&) = delete;

  /// Null when `arena_bytes` was 0, or its allocation failed.
  char* arena = nullptr;
  std::string arena_error;
  /// Non-blocking: it waits for nothing but the events it is told to.
  cudaStream_t copy_stream = nullptr;
  /// Free record events (recorded after a snapshot's copy on the training
  /// stream) and completion events (after a batch on the copy stream).
  std::vector<cudaEvent_t> ready_events;
  std::vector<cudaEvent_t> done_events;

 private:
  // The one teardown, for the destructor and a failed constructor.
  void release() noexcept;

  int device_;
  DeviceMemory memory_;
};

}  // namespace tensortap::detail
