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

struct RecordSpec;

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

  /// Becomes the record `spec` describes, in place: into memory this
  /// record already has (a kept staging slot's), a name and a shape are
  /// copied without allocating. Without `with_name` the name is left for
  /// the holder of a reference to it to fill in (staging's, `Slot`).
  inline void assign(const RecordSpec& spec, bool with_name = true);
};

/// A record as its producer already has it, by reference: what a capture
/// hands to staging, which copies it once, into the slot that keeps it
/// (sdk/src/core/staging.h). Building a `Record` on the capturing thread and
/// copying it into the slot cost a name and a shape copied twice, per
/// capture.
struct RecordSpec {
  Kind kind = Kind::Tensor;
  const std::string& name;
  std::int64_t step = 0;
  const DtypeInfo& dtype;
  c10::IntArrayRef shape;
  std::uint64_t nbytes = 0;
  Op op = Op::Store;
  bool stats_row = false;
  bool scan = false;
  /// Identifies the record across its chunks.
  std::uint64_t id = 0;
  /// `name` is the name table's copy, which outlives the run's writer
  /// thread: staging keeps a reference and the writer copies it, so a
  /// capture does not.
  bool name_kept = false;

  /// The spec of a record built beforehand (the CUDA copier's, a marker's).
  static RecordSpec of(const Record& r, std::uint64_t id) {
    return RecordSpec{r.desc.kind,   r.desc.name, r.desc.step, r.desc.dtype, r.desc.shape,
                      r.desc.nbytes, r.op,        r.stats_row, r.scan,       id};
  }
};

inline void Record::assign(const RecordSpec& spec, bool with_name) {
  desc.kind = spec.kind;
  if (with_name) desc.name.assign(spec.name);
  desc.step = spec.step;
  desc.dtype = spec.dtype;
  // Element by element: SmallVector's assign() called memcpy for a shape
  // of one or two dimensions.
  desc.shape.resize(spec.shape.size());
  for (std::size_t i = 0; i < spec.shape.size(); ++i) desc.shape[i] = spec.shape[i];
  desc.nbytes = spec.nbytes;
  op = spec.op;
  stats_row = spec.stats_row;
  scan = spec.scan;
}

}  // namespace tensortap::detail
