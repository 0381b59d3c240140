// A step's gradients in one or two kernel launches (batch_kernel.cu), not two
// (statistics) or one (a copy) per tensor, whose runtime calls cost the
// training thread 25-30 us a tensor on an H200. The first launch copies
// each tensor's stored form into the engine's arena and reduces its blocks'
// shares to partial results; the last block of a tensor to finish (or a
// second launch) merges them and writes its ten statistics into its slot of
// the step's statistics, which
// lie next to each other in the arena so that the copier moves them to the
// host in one copy. A tensor's statistics are bit for bit those of
// `launch_fused_stats` (the same blocks, each thread's values in the same
// order, the same merge trees), and its copy is its bytes (bfloat16
// widened to float32, as the writers store it).
//
// No CUDA or LibTorch header here, as stats_kernel.h: nvcc compiles the
// kernels without LibTorch; the fake runtime's tests link a host reference
// of them instead (tests/cuda/kernel_reference.h), which a [gpu] test
// checks the kernels against.
#pragma once

#include <cstdint>

#include "sdk/src/cuda/stats_kernel.h"

namespace tensortap::detail {

/// One tensor of a batch.
struct BatchTensor {
  /// Its values: `n` contiguous elements of `element` (device memory).
  const void* data = nullptr;
  std::int64_t n = 0;
  StatsElement element = StatsElement::Float32;
  /// Where its stored form goes (device memory: `n` elements, float32 for
  /// bfloat16), or null: statistics only.
  void* copy = nullptr;
  /// Where its ten statistics go as float64 (TENSORTAP_STATS_FIELDS'
  /// order), and the scratch of its partial results
  /// (`stats_partials(n) * kStatsPartialDoubles` float64 values); null: no
  /// statistics.
  double* stats = nullptr;
  double* scratch = nullptr;
};

/// Tensors one call of `launch_batch` takes: they travel as the kernels'
/// parameters (under the 4 KiB every CUDA version accepts).
constexpr int kBatchTensors = 64;

/// The stored bytes of `n` elements of `element` (`BatchTensor::copy`).
inline std::int64_t batch_copy_bytes(StatsElement element, std::int64_t n) {
  return n * (element == StatsElement::Float64 ? 8 : element == StatsElement::Float16 ? 2 : 4);
}

/// Queues on `stream` (a cudaStream_t of the current device) the copies
/// and statistics of `tensors[0..count)`, `count` at most `kBatchTensors`,
/// in one launch: with `counters` (at least `count` of them, zero, in
/// device memory; left zero again) each tensor's last block merges its
/// blocks' results; without, and when any tensor takes statistics, a
/// second launch does. No other runtime call unless a launch fails. Returns
/// the launches' cudaError_t (0: queued); an error of the caller's own work
/// that was pending is left there. Never waits for the device.
int launch_batch(const BatchTensor* tensors, int count, unsigned* counters, void* stream);

/// One tensor of a gather (`launch_copies`): `bytes` bytes from `from` to
/// `into`, both device memory of the stream's device, not overlapping.
struct CopyTensor {
  const void* from = nullptr;
  void* into = nullptr;
  std::int64_t bytes = 0;
};

/// Queues on `stream` the copies of `tensors[0..count)`, `count` at most
/// `kBatchTensors`, in one launch: a backward pass's gradients gathered
/// into the hooks' accumulators at its end (hooks/src/params.cpp) rather
/// than an ATen copy a parameter. Byte for byte (16 bytes a load where
/// both sides and the size are 16-byte aligned). Returns the launch's
/// cudaError_t (0: queued), as `launch_batch`. Never waits for the device.
int launch_copies(const CopyTensor* tensors, int count, void* stream);

}  // namespace tensortap::detail
