#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include <tensortap/kinds.h>

#include "writers/src/file.h"
#include "writers/src/stats_fields.h"
#include "writers/src/step_files.h"

namespace tensortap::detail {

class LinesFile;

/// The statistics of one tensor. min, max, mean, std (population, as
/// NumPy's default) and norm (L2) are over its finite values: one NaN does
/// not hide the rest; the NaN and Inf counts say what was left out. They are
/// NaN when no value is finite.
struct TensorStats {
#define TENSORTAP_REAL_(name) double name = 0;
#define TENSORTAP_COUNT_(name) std::int64_t name = 0;
  TENSORTAP_STATS_FIELDS(TENSORTAP_REAL_, TENSORTAP_COUNT_)
#undef TENSORTAP_REAL_
#undef TENSORTAP_COUNT_
};

/// The fields' names, in the schema's order (stats.npy's column names,
/// TensorBoard's tag suffixes, TensorBoardOptions::stats' words).
#define TENSORTAP_NAME_(name) #name,
constexpr std::array<const char*, kStatsFields> kStatsFieldNames = {TENSORTAP_STATS_FIELDS(TENSORTAP_NAME_, TENSORTAP_NAME_)};
#undef TENSORTAP_NAME_

/// The run's statistics table: `stats.npy`, a 1-D structured array with one
/// row per tensor and step (fields step, series, min, max, mean, std, norm,
/// nan, posinf, neginf, zeros, numel), and `stats_series.jsonl`, which names
/// each series: `{"series":0,"kind":"grad","name":"fc1.weight"}`. NumPy reads
/// the table in one `np.load`. Rows are appended; the header's row count is
/// rewritten in place after them, so a reader (or a crash) sees only whole
/// rows. Created at the first row. Used from the writer thread only.
///
/// Under Budget::KeepLatest (`keep_latest`) the table is in segments that
/// each hold whole steps (docs/design.md#statistics): `stats.npy` the first, so a
/// short run still loads in one `np.load`, then `stats.<n>.npy`; a give-up
/// deletes the segments whose steps are all given up.
class StatsFile {
 public:
  explicit StatsFile(const Dir& dir);
  ~StatsFile();
  StatsFile(const StatsFile&) = delete;
  StatsFile& operator=(const StatsFile&) = delete;

  /// Buffers a row; `flush()` writes it.
  void append(Kind kind, const std::string& name, std::int64_t step, const TensorStats& stats);
  /// Writes the buffered rows and makes them visible; with `durable`, also
  /// fsyncs. Throws `Error` with the path and errno.
  void flush(bool durable);
  std::int64_t rows() const { return rows_ + pending_rows_; }
  /// Closes the files; for after the last flush.
  void close() noexcept;
  /// Budget::KeepLatest: a segment ends, at a step's end, once it holds
  /// about `segment_bytes`.
  void keep_latest(std::uint64_t segment_bytes) { segment_bytes_ = segment_bytes; }
  /// What a give-up below `below` would free (KeepLatest's complete segments).
  std::uint64_t bytes_below(std::int64_t below) const;
  /// Rows in segments given up so far.
  std::int64_t rows_given_up() const { return segments_.items_given_up(); }
  /// Deletes the complete segments whose steps are all below `below`; the
  /// bytes freed. Throws (see StepFiles::give_up).
  std::uint64_t give_up(std::int64_t below);

 private:
  void open();
  // Writes `bytes` (`rows` whole rows) after the rows on disk, then the header.
  void write_rows(const std::string& bytes, std::int64_t rows);
  // Writes the segments ended since the last flush, closing and listing each.
  void write_ended();
  // The current segment is complete: closed and listed for a give-up.
  void end_segment(std::int64_t min_step, std::int64_t max_step);
  const Dir& dir_;
  File file_;
  std::unique_ptr<LinesFile> series_file_;
  std::int64_t rows_ = 0;                                 // rows on disk and counted by the header
  std::int64_t pending_rows_ = 0;                         // rows in `pending_`
  std::string pending_;                                   // row bytes not yet written
  std::string pending_series_;                            // stats_series.jsonl lines not yet written
  std::unordered_map<std::string, std::int64_t> series_;  // kind byte + name -> series
  // KeepLatest's segments: the size one grows to (0: one table), the
  // number and steps of the one written, the rows of segments ended in
  // `pending_` before the next flush (each a whole segment's tail).
  std::uint64_t segment_bytes_ = 0;
  std::uint32_t segment_ = 0;
  std::int64_t segment_rows_ = 0;  // the segment's rows, on disk and pending
  std::int64_t min_step_ = 0, max_step_ = -1;
  struct Ended {
    std::string bytes;
    std::int64_t rows, min_step, max_step;
  };
  std::vector<Ended> ended_;
  StepFiles segments_;
};

}  // namespace tensortap::detail
