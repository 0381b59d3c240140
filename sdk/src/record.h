#pragma once

// The pipeline's message: what a capturing thread hands to the writer
// thread, through staging (and, for CUDA tensors, the copier). Like a fast
// logger's message kinds (spdlog's log/flush/terminate), each record carries
// a typed operation; the writers see only its `RecordDesc`.

#include <cstdint>

#include "writers/src/writer.h"

namespace tensortap::detail {

/// What the writer thread does with a record.
enum class Op : std::uint8_t {
  /// Write the tensor to the run's format.
  Store,
  /// Give the tensor to the flight recorder, which holds it until a dump.
  Hold,
  /// Only a statistics row; the bytes are the tensor.
  Stats,
  /// Only a statistics row; the bytes are its statistics vector
  /// (`kStatsVectorSize` float64 values), computed on the tensor's device.
  StatsVector,
  /// Not a tensor: `Recorder::dump()` was called in `desc.step`. No bytes.
  Dump,
};

/// One record in the pipeline.
struct Record {
  RecordDesc desc;
  Op op = Op::Store;
  /// Store or Hold: a statistics row too (Stats and StatsVector always
  /// have one).
  bool stats_row = false;
  /// Hold: scan for NaN and Inf even without a row, for the flight
  /// recorder's non_finite trigger.
  bool scan = false;

  /// Whether the writer thread computes statistics of the bytes.
  bool computes_stats() const {
    return op == Op::Stats || ((op == Op::Store || op == Op::Hold) && (stats_row || scan));
  }
  /// Whether a statistics row is appended.
  bool has_row() const { return op == Op::Stats || op == Op::StatsVector || stats_row; }
};

}  // namespace tensortap::detail
