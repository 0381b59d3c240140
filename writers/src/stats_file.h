#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>

#include <tensortap/kinds.h>

#include "writers/src/file.h"

namespace tensortap::detail {

class LinesFile;

/// The statistics schema, in its one order: stats.npy's columns after step
/// and series, the device statistics vector (sdk/src/pipeline/stats.h), and the
/// members of TensorStats and of the public TensorSummary. `REAL(name)` for
/// the float64 fields, `COUNT(name)` for the int64 counts. Python's
/// STATS_FIELDS reads the same names from the file's header.
#define TENSORTAP_STATS_FIELDS(REAL, COUNT) \
  REAL(min) REAL(max) REAL(mean) REAL(std) REAL(norm) COUNT(nan) COUNT(posinf) COUNT(neginf) COUNT(zeros) COUNT(numel)

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

/// How many fields the schema has, and how many of them are float64 (they
/// come first).
#define TENSORTAP_ONE_(name) +1
constexpr int kStatsFields = 0 TENSORTAP_STATS_FIELDS(TENSORTAP_ONE_, TENSORTAP_ONE_);
#define TENSORTAP_NONE_(name)
constexpr int kStatsRealFields = 0 TENSORTAP_STATS_FIELDS(TENSORTAP_ONE_, TENSORTAP_NONE_);
#undef TENSORTAP_ONE_
#undef TENSORTAP_NONE_

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

 private:
  void open();
  const Dir& dir_;
  File file_;
  std::unique_ptr<LinesFile> series_file_;
  std::int64_t rows_ = 0;                                 // rows on disk and counted by the header
  std::int64_t pending_rows_ = 0;                         // rows in `pending_`
  std::string pending_;                                   // row bytes not yet written
  std::string pending_series_;                            // stats_series.jsonl lines not yet written
  std::unordered_map<std::string, std::int64_t> series_;  // kind byte + name -> series
};

}  // namespace tensortap::detail
