#pragma once

// Counters in a header of their own: the recorder's facade returns them,
// and the sdk's internals that count or write them (the front and back
// ends, run.json) need them without the facade.

#include <cstdint>

namespace tensortap {

/// Counters of a recorder, as of the call (`Recorder::counters()`).
struct Counters {
  /// Records taken on sampled steps and handed to the pipeline: full
  /// tensors, statistics-only records (`stats_every` steps that are not
  /// full-tensor steps), and records a hook took but could not hand over
  /// (also in `errors`). Not those in `dropped`.
  std::int64_t captured = 0;
  /// Full-tensor records written to the run's files and indexed; a held
  /// step of the flight recorder counts once it is dumped.
  std::int64_t records = 0;
  /// Bytes of tensor data in those records (headers not counted).
  std::int64_t bytes = 0;
  /// Records dropped: staging was full (`Overflow::DropNewest`), or the
  /// flight recorder could not hold them within `flight_recorder_bytes`
  /// (one larger than that is dropped before it is copied).
  std::int64_t dropped = 0;
  /// Records that will never be readable: a hook that could not record its
  /// tensor, a copy that failed (CUDA), a write that failed (disk full, I/O
  /// error). The first error's message is what `flush()` and `close()` throw.
  std::int64_t errors = 0;
  /// Rows written to the statistics table (`Options::stats_every`).
  std::int64_t stats_rows = 0;
  /// Flight-recorder dumps so far (`Options::flight_recorder`).
  std::int64_t dumps = 0;
  /// Full-tensor records a disk budget refused (`Options::max_bytes`,
  /// `Budget::StopCapture`): not errors; from then on full capture stops.
  std::int64_t budget_refused = 0;
  /// Seconds the capturing threads spent waiting for staging room under
  /// `Overflow::Block` (the disk could not keep up): 0 while it keeps up.
  double blocked_seconds = 0;
};

}  // namespace tensortap
