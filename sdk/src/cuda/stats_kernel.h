// The statistics vector of a CUDA tensor in two kernels (stats_kernel.cu):
// the fused form of device_stats' ATen reductions. Issue 35 measured those
// on an H200 at about 40 kernels and 0.58 ms of the training thread's time
// per tensor, most of it ATen's dispatch of ~47 operations; statistics of
// every gradient every step made a step 5-7 times slower.
//
// No CUDA or LibTorch header here: stats_kernel.cu is compiled by nvcc
// without LibTorch, and capture.cpp (LibTorch, no nvcc) calls it.
#pragma once

#include <cstdint>

#include "sdk/src/cuda/stats_partial.h"

namespace tensortap::detail {

/// The element types the fused kernels read; other types take ATen's path.
enum class StatsElement : int { Float32, Float64, Float16, BFloat16 };

/// float64 values of scratch a partial result takes (fused::Partial).
constexpr int kStatsPartialDoubles = static_cast<int>(sizeof(fused::Partial) / sizeof(double));

/// How many partial results (blocks) `launch_fused_stats` uses for `n`
/// values: its scratch holds `stats_partials(n) * kStatsPartialDoubles`
/// float64 values.
inline int stats_partials(std::int64_t n) {
  const std::int64_t per_block = fused::kThreads * fused::kPerThread;
  const std::int64_t blocks = (n + per_block - 1) / per_block;
  return static_cast<int>(blocks < 1 ? 1 : blocks > fused::kMaxPartials ? fused::kMaxPartials : blocks);
}

/// What `launch_fused_stats` returns when an error of the caller's own work
/// was pending (cudaPeekAtLastError): it launched nothing and left it there.
constexpr int kStatsNotLaunched = -1;

/// Queues on `stream` (a cudaStream_t of the current device) the ten
/// statistics of the `n` contiguous values at `data` (device memory), in
/// TENSORTAP_STATS_FIELDS' order, as float64 into `out` (device memory).
/// Returns the launch's cudaError_t (0: queued), or `kStatsNotLaunched`.
/// Never waits for the device.
int launch_fused_stats(const void* data, StatsElement element, std::int64_t n, double* scratch, double* out,
                       void* stream);

}  // namespace tensortap::detail
