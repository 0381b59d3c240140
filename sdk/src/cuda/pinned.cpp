#include "sdk/src/cuda/pinned.h"

#include <cuda_runtime_api.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <unordered_map>

#include "sdk/src/cuda/device.h"

namespace tensortap::detail {
namespace {

// What HostMemory promises, as the default memory does.
constexpr std::size_t kPage = 4096;

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

}  // namespace tensortap::detail
