#pragma once

// What the core calls to capture CUDA tensors. This header compiles with any
// LibTorch: without CUDA (no TENSORTAP_HAVE_CUDA) the functions are stubs
// (sdk/src/cuda/capture_none.cpp) and make_cuda_engine() returns nullptr, so
// the core needs no #ifdef.

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include "sdk/src/core/record.h"
#include "sdk/src/core/staging.h"

namespace tensortap::detail {

class CudaEngine;  // sdk/src/cuda/engine.h

/// An engine that feeds `staging`, or nullptr when this build has no engine
/// or the machine no CUDA device. `device_bytes` is each device's arena
/// for snapshots, and as much again for snapshots of tensors larger than
/// the arena (one larger than that is held alone). `report` receives the copier thread's
/// failures (`Failures::add`); it must not throw. Creates no thread and
/// touches no device until the first CUDA capture; then the copier thread
/// moves `staging`'s buffers to pinned memory.
/// `stats_in_arena`: statistics-only captures through
/// `cuda_capture_fused_stats` (TENSORTAP_CUDA_STATS). `batch_events`: one
/// event a step (TENSORTAP_CUDA_BATCH, CudaEngineOptions::batch_events).
std::shared_ptr<CudaEngine> make_cuda_engine(Staging& staging, std::size_t device_bytes,
                                             std::function<void(const std::string&)> report, bool stats_in_arena,
                                             bool batch_events);

/// A step's end (`Recorder::step()`, training thread): with one event a
/// step, the snapshots taken since the last are handed to the copier.
void cuda_end_step(CudaEngine& engine) noexcept;

/// Captures CUDA tensor `tensor` as the record `spec` describes (its
/// dtype's `stored`, `nbytes` and the rest filled in as for a CPU tensor):
/// snapshots it on its device, in order on the device's current stream,
/// and queues the snapshot for the copier (sdk/src/cuda/capture_core.h). Never synchronizes with
/// the device. Returns true once queued; false when refused: the device
/// memory budget is full and `may_drop` (Overflow::DropNewest), or the
/// engine is stopped. With `may_drop` false it waits for room instead.
/// Throws `Error` naming the record when the snapshot cannot be taken.
bool cuda_capture(CudaEngine& engine, const RecordSpec& spec, const at::Tensor& tensor, bool may_drop);

/// Returns when every CUDA capture so far is in host staging (call it
/// before `Staging::wait_drained()`).
void cuda_flush(CudaEngine& engine);

/// Moves what is queued into staging, ends the copier thread and frees the
/// device memory. Call it before the writer (`WriterThread::stop()`) stops.
void cuda_stop(CudaEngine& engine);

/// The statistics vector (`device_stats`'s) of a contiguous float32,
/// float64, float16 or bfloat16 CUDA tensor from tensortap's fused kernels
/// (stats_kernel.cu), queued on the tensor's device's current stream; an
/// undefined tensor where they do not apply (another dtype or layout, a build
/// without them, a launch that failed), and `device_stats` then takes ATen's
/// path.
at::Tensor fused_device_stats(const at::Tensor& tensor);

/// A statistics-only capture of CUDA tensor `tensor` with no tensor made:
/// when the engine reduces statistics into its arena and the fused kernels
/// take `tensor` (as `fused_device_stats`), room for the ten float64
/// values and the kernels' scratch is reserved in the device's arena, the
/// kernels write there on the current stream, and that is queued as the
/// record `spec` (a float64 vector of 10: Op::StatsVector): no allocation,
/// no device-to-device copy. Returns nullopt where it does not apply (the
/// caller takes `fused_device_stats`' path), otherwise whether it was
/// queued (false: refused, as `cuda_capture`).
std::optional<bool> cuda_capture_fused_stats(CudaEngine& engine, const RecordSpec& spec, const at::Tensor& tensor,
                                             bool may_drop);

/// A record a step's batch of gradients takes (TENSORTAP_CUDA_BATCH=on,
/// sdk/src/cuda/batch.h): what `cuda_capture` or the statistics path would
/// have been given, held until the batch goes. `op` is Op::Store or
/// Op::Hold (the tensor's stored form, `dtype`), or Op::StatsVector (its
/// ten statistics).
struct CudaBatchEntry {
  Kind kind = Kind::Grad;
  std::string name;
  std::int64_t step = 0;
  const DtypeInfo* dtype = nullptr;
  at::Tensor tensor;
  Op op = Op::Store;
  bool stats_row = false;
  bool scan = false;
  std::uint64_t id = 0;
  /// Set by `cuda_capture_batch`: queued (false: refused under `may_drop`),
  /// or `left` for the per-tensor path (nothing of it taken).
  bool queued = false;
  bool left = false;
};

/// Whether `engine` batches a step's gradients (one event a step, and this
/// build has tensortap's kernels), and whether it takes `tensor` (stored as
/// `dtype`) in a batch: a contiguous float32, float64, float16 or bfloat16
/// CUDA tensor, not a negated or conjugated view.
bool cuda_batches(const CudaEngine& engine) noexcept;
bool cuda_batchable(const at::Tensor& tensor, const DtypeInfo& dtype);

/// Captures `entries` as batches (one a device, on its current stream),
/// never synchronizing with the device. Throws `Error` naming the batch
/// when it cannot be taken (a stream being captured into a CUDA graph, a
/// launch that failed): none of its entries is queued then.
void cuda_capture_batch(CudaEngine& engine, std::vector<CudaBatchEntry>& entries, bool may_drop);

/// Copies each `from[i]` into `into[i]`, a contiguous tensor of its dtype
/// and size on its CUDA device, in order on that device's current stream:
/// those tensortap's copy kernel takes (contiguous, and this build has the
/// kernels) in one launch a device for each 64, the rest by ATen's copy.
/// A backward pass's gradients gathered at its end (hooks/src/params.cpp,
/// TENSORTAP_CUDA_BATCH=on). Never synchronizes with the device; a launch
/// that fails leaves its tensors to ATen's copy.
void cuda_gather(const std::vector<at::Tensor>& from, std::vector<at::Tensor>& into);

/// CUDA tensors this process has queued through an engine: lets tests check
/// that captures take this path rather than a copy through the host.
std::uint64_t cuda_captures() noexcept;

}  // namespace tensortap::detail
