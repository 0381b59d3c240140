#pragma once

// The hot path's second half, from a sampled, selected tensor to a record
// committed to staging: what a hook, a Tap or `capture()` runs once the
// front end has decided the tensor is wanted (sdk/src/front_end.h). CPU
// tensors are copied here, before the call returns; CUDA tensors go to the
// copier (sdk/src/cuda).

#include <atomic>
#include <cstdint>
#include <string>

#include <ATen/core/Tensor.h>

#include <tensortap/options.h>

#include "sdk/src/staging.h"

namespace tensortap::detail {

class CudaEngine;

/// Snapshots tensors into records and queues them. Thread-safe.
class Enqueue {
 public:
  /// Whether a record was queued.
  enum class Result { Queued, Dropped };

  /// `staging` must outlive it. `holds`: full tensors go to the flight
  /// recorder; `scans`: those are scanned for NaN and Inf.
  Enqueue(const Options& options, Staging& staging, bool holds, bool scans);
  /// CUDA tensors go through `engine` (not null) from now on.
  void use_engine(CudaEngine* engine) { engine_ = engine; }

  /// Throws `Error` naming the record if `t` cannot be stored.
  void check(Kind kind, const std::string& name, const at::Tensor& t, std::int64_t step) const;
  /// Queues `t` as record `name` of `step`: the full tensor if `full`, its
  /// statistics (only) otherwise. `Dropped` when staging (or the device
  /// budget) is full under `Overflow::DropNewest`, or the pipeline stopped.
  Result tensor(Kind kind, std::string name, const at::Tensor& t, std::int64_t step, bool full, bool stats_row);
  /// Queues a `Recorder::dump()` marker behind every record queued before.
  void dump_marker(std::int64_t step);

 private:
  Staging& staging_;
  CudaEngine* engine_ = nullptr;
  const bool may_drop_;
  const bool holds_;
  const bool scans_;
  // The most dimensions the run's format can store, and why.
  const std::int64_t max_dims_;
  const char* const max_dims_why_;
  std::atomic<std::uint64_t> next_id_{0};
};

}  // namespace tensortap::detail
