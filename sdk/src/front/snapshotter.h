#pragma once

// The hot path, from a tensor a hook, a Tap or `capture()` hands over (the
// front end's inline `active()` test has passed, sdk/src/front/front_end.h) to a
// record committed to staging. CPU tensors are copied here, before the call
// returns; CUDA tensors go to the copier (sdk/src/cuda).

#include <array>
#include <atomic>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>

#include <ATen/core/Tensor.h>

#include <tensortap/error.h>
#include <tensortap/options.h>

#include "sdk/src/select/sampling.h"
#include "sdk/src/core/staging.h"

namespace tensortap::detail {

class CudaEngine;
class FlightRecorder;

/// A capture refused because the run's disk has no room for it now: not the
/// caller's error, so `Recorder::capture()` counts it under
/// `Options::on_error`, as a write that fails, instead of throwing.
class NoRoom : public Error {
 public:
  using Error::Error;
};

/// Snapshots tensors into records and queues them: the hot path from a
/// tensor a hook wants to a record committed to staging. Thread-safe.
class Snapshotter {
 public:
  /// `staging`, `sampling` and `closed` (the front end's flag) must outlive
  /// it. `holds`: full tensors go to the flight recorder; `scans`: those
  /// are scanned for NaN and Inf.
  Snapshotter(const Options& options, Staging& staging, const Sampling& sampling, const std::atomic<bool>& closed,
          bool holds, bool scans);
  /// On a rank that captures: records may be queued from now on, CUDA
  /// tensors through `engine` (null without CUDA), and full tensors stop
  /// once `flight` says capture has halted.
  /// `space_fd`, a descriptor in the run's file system, tells how much
  /// room a record larger than staging has (-1: not checked) in `run_dir`.
  void open(CudaEngine* engine, const FlightRecorder* flight, int space_fd, std::string run_dir) {
    engine_ = engine;
    flight_ = flight;
    space_fd_ = space_fd;
    run_dir_ = std::move(run_dir);
  }

  /// Snapshots `tensor` and queues it as record `name` of `step`, as the
  /// step's plan says: the full tensor, its statistics, or nothing. Throws
  /// `Error` naming the record if it cannot be stored. Does nothing once
  /// closed: a late hook must not fail. `name_kept`: `name` is the name
  /// table's own copy (`GivenName::kept()`), which staging may keep by
  /// reference.
  void record(Kind kind, const std::string& name, const at::Tensor& tensor, std::int64_t step, bool name_kept = false);
  /// Training thread: the CUDA records this thread makes until
  /// `end_batch()` (a step's gradients) go to the device as one batch
  /// (TENSORTAP_CUDA_BATCH=on, sdk/src/cuda/batch.h) rather than a capture
  /// each. Without an engine that batches, nothing changes.
  void begin_batch();
  /// Captures the batch; what it could not take goes the per-tensor way.
  /// Throws `Error` as a capture does (the first failure), once every
  /// record has gone.
  void end_batch();
  /// Queues a `Recorder::dump()` marker behind every record queued before.
  void dump_marker(std::int64_t step);
  /// A record a hook could not hand over: counted as captured (and, by the
  /// caller, as failed).
  void count_lost() noexcept { captured_.fetch_add(1, std::memory_order_relaxed); }

  /// Records handed to the pipeline, and records dropped (staging full
  /// under `Overflow::DropNewest`).
  std::int64_t captured() const { return captured_.load(std::memory_order_relaxed); }
  std::int64_t dropped() const { return dropped_.load(std::memory_order_relaxed); }

 private:
  // Throws `Error` naming the record if `t` cannot be stored; returns its
  // dtype's description.
  const DtypeInfo& check(Kind kind, const std::string& name, const at::Tensor& t, std::int64_t step) const;
  // check()'s throw, out of line: the common case's code stays small.
  [[noreturn]] void refuse(Kind kind, const std::string& name, const at::Tensor& t, std::int64_t step,
                           const char* why) const;
  // Queues `t`, of dtype `info`: the full tensor if `full` (for the flight
  // recorder to hold if `hold`), its statistics otherwise. False when
  // refused: staging (or the device budget) full under
  // Overflow::DropNewest, or the pipeline stopped.
  bool queue(Kind kind, const std::string& name, const at::Tensor& t, const DtypeInfo& info, std::int64_t step,
             bool full, bool hold, bool stats_row, bool name_kept);
  // queue()'s statistics of a CUDA tensor reduced by the fused kernels into
  // the engine's arena; nullopt where they do not apply (the caller then
  // reduces it as a tensor).
  std::optional<bool> queue_fused_stats(Kind kind, const std::string& name, const at::Tensor& tensor,
                                        std::int64_t step, bool stats_row, bool name_kept);
  // queue()'s record that fits a staging buffer but is not its bytes as they
  // are (or too large for one round of the lock): reserved, copied, committed.
  // False when dropped.
  bool copy_in(const RecordSpec& spec, const at::Tensor& src);

  // queue()'s part with a batch open on this thread: whether it took the
  // record (a batchable CUDA tensor).
  bool batched(Kind kind, const std::string& name, const at::Tensor& tensor, const DtypeInfo& info,
               std::int64_t step, bool full, bool hold, bool stats_row);
  // Throws naming the record if its `spec.nbytes` cannot fit where the run
  // is written, before a byte of it is streamed: `Error` if it exceeds the
  // whole file system (an expanded view of 2^40 elements, the caller's
  // error), `NoRoom` if only the free space.
  void check_room(Kind kind, const std::string& name, std::int64_t step, std::uint64_t nbytes,
                  const at::Tensor& src) const;
  // Streams a record larger than a staging buffer through it in chunks.
  // False when dropped before its first chunk or cut off by close().
  bool stream(const RecordSpec& spec, const at::Tensor& src, bool host_bytes);

  Staging& staging_;
  const Sampling& sampling_;
  const std::atomic<bool>& closed_;
  CudaEngine* engine_ = nullptr;
  const FlightRecorder* flight_ = nullptr;
  int space_fd_ = -1;
  std::string run_dir_;
  const bool may_drop_;
  const bool compresses_;
  const bool holds_;
  const bool scans_;
  // Options::flight_recorder_bytes: a record larger is never held.
  const std::uint64_t hold_budget_;
  // The most dimensions the run's format can store, and why.
  const std::int64_t max_dims_;
  const char* const max_dims_why_;
  // dtype_info() of each ScalarType, looked up once here rather than
  // through a function-local static per capture.
  std::array<const DtypeInfo*, static_cast<std::size_t>(c10::ScalarType::NumOptions)> dtypes_{};
  // The largest CPU record copied under one round of staging's lock.
  const std::uint64_t put_bytes_;
  std::atomic<std::uint64_t> next_id_{0};
  std::atomic<std::int64_t> captured_{0};
  std::atomic<std::int64_t> dropped_{0};
};

}  // namespace tensortap::detail
