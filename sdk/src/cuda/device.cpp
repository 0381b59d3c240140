#include "sdk/src/cuda/device.h"

#include <fmt/format.h>

#include "writers/src/check.h"

namespace tensortap::detail {

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

// A failed call leaves its error as the thread's last error, which the next
// kernel launch check of torch (on the training thread) would report as its
// own: every failure here is cleared.
DeviceGuard::DeviceGuard(int device) {
  int current = -1;
  if (cudaGetDevice(&current) != cudaSuccess) {
    cudaGetLastError();
    return;
  }
  if (current == device) return;
  if (cudaSetDevice(device) != cudaSuccess) {
    cudaGetLastError();
    return;
  }
  previous_ = current;
}

DeviceGuard::~DeviceGuard() {
  if (previous_ >= 0 && cudaSetDevice(previous_) != cudaSuccess) cudaGetLastError();
}

DeviceResources::DeviceResources(int device, std::size_t arena_bytes, DeviceMemory memory, std::size_t ready_count,
                                 std::size_t done_count, std::atomic<std::uint64_t>& events_created)
    : device_(device), memory_(std::move(memory)) {
  DeviceGuard guard(device);
  try {
    // Non-blocking: the copies must not wait for work on the legacy default
    // stream, only for the events they are told to wait for.
    const cudaError_t e = cudaStreamCreateWithFlags(&copy_stream, cudaStreamNonBlocking);
    if (e != cudaSuccess) {
      cudaGetLastError();
      copy_stream = nullptr;
      fail("cannot create a copy stream on cuda:{}: {}", device, cuda_error_string(e));
    }
    ready_events.reserve(ready_count);
    done_events.reserve(done_count);
    cudaError_t failed = cudaSuccess;
    for (std::size_t i = 0; i < ready_count && failed == cudaSuccess; ++i) {
      cudaEvent_t ev = nullptr;
      failed = cudaEventCreateWithFlags(&ev, cudaEventDisableTiming);
      if (failed == cudaSuccess) ready_events.push_back(ev);
    }
    for (std::size_t i = 0; i < done_count && failed == cudaSuccess; ++i) {
      cudaEvent_t ev = nullptr;
      // Blocking sync: the copier thread sleeps while copies run instead of
      // spinning on a core the training process may need.
      failed = cudaEventCreateWithFlags(&ev, cudaEventDisableTiming | cudaEventBlockingSync);
      if (failed == cudaSuccess) done_events.push_back(ev);
    }
    events_created.fetch_add(ready_events.size() + done_events.size(), std::memory_order_relaxed);
    if (failed != cudaSuccess) {
      cudaGetLastError();
      fail("cannot create CUDA events on cuda:{}: {}", device, cuda_error_string(failed));
    }
  } catch (...) {
    release();
    throw;
  }
  if (arena_bytes == 0) return;
  // Last, and not fatal: in training, the free memory is usually torch's
  // cache, and the engine can do without an arena.
  try {
    arena_error.reserve(200);  // a message of the usual length fits
    void* p = nullptr;
    if (memory_.allocate) {
      p = memory_.allocate(device, arena_bytes);
      if (p == nullptr) arena_error = "no memory";
    } else {
      const cudaError_t e = cudaMalloc(&p, arena_bytes);
      if (e != cudaSuccess) {
        cudaGetLastError();
        p = nullptr;
        arena_error = cuda_error_string(e);
      }
    }
    arena = static_cast<char*>(p);
  } catch (const std::exception& e) {
    arena = nullptr;
    try {
      arena_error = e.what();
    } catch (...) {
      arena_error = "no memory";  // fits: reserved above
    }
  }
}

DeviceResources::~DeviceResources() { release(); }

void DeviceResources::release() noexcept {
  DeviceGuard guard(device_);
  for (cudaEvent_t e : ready_events) cudaEventDestroy(e);
  for (cudaEvent_t e : done_events) cudaEventDestroy(e);
  ready_events.clear();
  done_events.clear();
  if (copy_stream != nullptr) cudaStreamDestroy(copy_stream);
  if (arena != nullptr) {
    if (memory_.release) {
      try {
        memory_.release(device_, arena);
      } catch (...) {
        // It must not throw; if it does all the same, the memory is lost,
        // not the teardown.
      }
    } else {
      cudaFree(arena);
    }
  }
  copy_stream = nullptr;
  arena = nullptr;
  // At exit the runtime may be unloading already: nothing to do about it,
  // and the next call must not see the error.
  cudaGetLastError();
}

}  // namespace tensortap::detail
