#pragma once

// Pinned host memory for the staging buffers that CUDA snapshots are copied
// into. A memory provider for Staging, not part of the engine: the copy
// engine writes into pinned memory without a bounce through the driver.

#include <cstddef>

#include "sdk/src/core/staging.h"

namespace tensortap::detail {

/// Pinned host memory for Staging (`cudaHostAlloc`, portable to every
/// device). When pinning fails it falls back to pageable memory, and says so
/// once on stderr: captures stay correct, only slower.
HostMemory pinned_host_memory();

/// Bytes of pinned memory that `pinned_host_memory()` holds now.
std::size_t pinned_host_bytes() noexcept;

}  // namespace tensortap::detail
