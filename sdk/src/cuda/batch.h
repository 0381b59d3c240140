#pragma once

// A step's gradients through the engine in one batch (behind
// TENSORTAP_CUDA_BATCH=on, docs/recording.md): the runtime-only core, as capture_core.h is
// for one tensor. Room for every record is reserved in the device's arena,
// one `launch_batch` (one kernel launch) copies the tensors and reduces
// their statistics into it, and the records are submitted: with one event a
// step, the training thread makes the launches and, once a step, the graph
// check, and nothing else (the step's end records the event). The records
// lie next to each other in the arena, so the copier moves a step's batch
// to the host in one copy.
//
// Runtime-only: the LibTorch side gives the tensors' device memory, and a
// benchmark built without CUDA LibTorch (bench/bench_cuda_host.cpp) gives
// its own, against the fake runtime, whose kernels are host references of
// batch_kernel.cu's (tests/cuda/kernel_reference.h).

#include <cuda_runtime_api.h>

#include <cstddef>
#include <string>

#include "sdk/src/cuda/batch_kernel.h"
#include "sdk/src/cuda/engine.h"
#include "sdk/src/core/record.h"

namespace tensortap::detail {

/// One tensor of a batch and its records.
struct BatchItem {
  /// Its values (`data`, `n`, `element`), the caller's; `copy`, `stats` and
  /// `scratch` are the batch's.
  BatchTensor tensor;
  /// Its full record, of `batch_copy_bytes(element, n)` bytes (the stored
  /// form), or null.
  const RecordSpec* full = nullptr;
  /// Its statistics record (Op::StatsVector: `kStatsVectorSize` float64
  /// values), or null.
  const RecordSpec* stats = nullptr;
  /// Set by `capture_batch_on_engine`: how many of its records were queued
  /// (fewer: refused, the arena full under `may_drop`), or `left`: too large
  /// for a batch, for the caller's per-tensor path, nothing of it taken.
  int queued = 0;
  bool left = false;
};

/// Captures `items[0..count)` on `device`, in order on `stream` (the
/// device's current stream; the device current): `launch_batch` for each
/// `kBatchTensors` of them, after a CUDA-graph check (with one event a
/// step, once a step). A tensor whose records take more than a quarter of
/// the arena is `left`. Throws `Error` naming the batch's step and size when
/// its stream is being captured into a CUDA graph, or the launch fails;
/// what it had reserved is given back first.
void capture_batch_on_engine(CudaEngine& engine, int device, cudaStream_t stream, BatchItem* items, std::size_t count,
                             bool may_drop);

}  // namespace tensortap::detail
