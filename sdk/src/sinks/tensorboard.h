#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <unordered_set>
#include <vector>

#include <tensortap/options.h>

#include "writers/src/dtypes.h"
#include "writers/src/file.h"
#include "writers/src/stats_file.h"
#include "writers/src/step_files.h"
#include "writers/src/writer.h"

namespace tensortap::detail {

class EventFile;

/// Whether this build writes TensorBoard events (CMake found protobuf).
bool tensorboard_built() noexcept;

/// The bucket of the finite value `x` among the fixed limits (EVENTS.md):
/// the first whose limit is above `x` (`std::upper_bound`), the last for
/// the largest double.
std::size_t histogram_bucket(double x);

/// A histogram of a record's values, fed chunk by chunk in order
/// (writers/src/tensorboard/EVENTS.md: fixed exponential buckets, finite
/// values only, each value as the statistics see it).
class HistogramAccumulator {
 public:
  explicit HistogramAccumulator(Element stored);
  ~HistogramAccumulator();
  /// `nbytes` must be whole elements.
  void add(const void* data, std::size_t nbytes);
  /// Finite values seen so far.
  double count() const;
  struct State;

 private:
  friend class TensorBoard;
  Element stored_;
  std::unique_ptr<State> state_;
};

/// The writer thread's TensorBoard output (`Options::tensorboard`): turns
/// statistics rows, 0-d `tensor` records, histograms and dumps into events
/// of one `EventFile` in the run directory, and writes the custom scalars
/// layout again whenever a name needs a chart (EVENTS.md). Writer thread
/// only.
class TensorBoard {
 public:
  /// Creates the event file. Throws `Error` naming its path.
  TensorBoard(const Dir& dir, const TensorBoardOptions& options);
  ~TensorBoard();
  TensorBoard(const TensorBoard&) = delete;
  TensorBoard& operator=(const TensorBoard&) = delete;

  /// A statistics row: a scalar `<kind>/<name>/<stat>` per statistic of
  /// `TensorBoardOptions::stats`, and `<kind>/<name>/nonfinite` from the
  /// first row with a NaN or an Inf (unless a count was asked for). A 0-d
  /// `tensor` record gets none: its one scalar is `tensor/<name>`, which
  /// `values` writes from its bytes (they always reach this thread: the
  /// snapshotter never reduces a 0-d tensor to a statistics vector).
  void statistics(const RecordDesc& desc, const TensorStats& stats);
  /// A whole record's bytes: its `tensor/<name>` scalar if it is a 0-d
  /// `tensor` record, else its histogram at a histogram step.
  void values(const RecordDesc& desc, const void* data, std::size_t nbytes);
  /// For a record that comes in chunks: a histogram to feed, or null when
  /// its step takes none.
  std::unique_ptr<HistogramAccumulator> histogram_for(const RecordDesc& desc) const;
  void histogram_done(const RecordDesc& desc, const HistogramAccumulator& h);
  /// A text event at `step` (a flight-recorder dump's line).
  void text(std::int64_t step, const std::string& tag, const std::string& text);
  /// Writes the events so far (see `EventFile::flush`). Throws `Error`.
  void flush(bool durable);
  void close();
  /// Budget::KeepLatest: a new event file begins, at a step's first event
  /// (in the order events come: a step may span two files), once one holds
  /// about `file_bytes` (TensorBoard reads a directory's files as one run);
  /// a give-up deletes the files whose steps are all given up. Throws (see
  /// StepFiles::give_up).
  void keep_latest(std::uint64_t file_bytes) { file_bytes_ = file_bytes; }
  std::uint64_t bytes_below(std::int64_t below) const { return files_.bytes_below(below); }
  std::uint64_t give_up(std::int64_t below) { return files_.give_up(dir_, below); }
  std::int64_t files_given_up() const { return files_.given_up(); }

 private:
  // Ends the event file for the next (KeepLatest); throws after the roll
  // if the old file's last events could not be written.
  void roll();
  bool histogram_step(std::int64_t step) const;
  void scalar(const RecordDesc& desc, double value);
  // The tag scheme (docs/design.md#tensorboard) gives a 0-d tensor named
  // "x/norm" the tag of the norm statistic of tensor "x": the two charts
  // mix. The tags stay; each such pair is said once on stderr, naming both.
  void check_tag_of_scalar(const std::string& name);
  void check_tags_of_statistics(const std::string& name);
  void say_tags_collide(const std::string& scalar, const std::string& statistics) const;
  // The custom scalars layout (EVENTS.md): the names each category charts,
  // as in the tags; a name first seen makes it due, written by flush().
  enum Category : std::size_t { kScalars, kNorms, kStds };
  void chart(std::size_t category, const std::string& name);
  void write_layout();
  // Appends an event at `step`, keeping the highest step written.
  void append(std::int64_t step, const std::string& event);
  const Dir& dir_;
  std::unique_ptr<EventFile> file_;
  // KeepLatest: the size a file grows to (0: one file), the steps of the
  // file written, the files before it.
  std::uint64_t file_bytes_ = 0;
  std::int64_t min_step_ = 0, max_step_ = -1;
  // The step of the event appended last.
  std::int64_t prev_step_ = -1;
  StepFiles files_;
  const std::int64_t histograms_every_;
  // The statistics written (TensorBoardOptions::stats), by the schema's
  // index, and whether their NaN/Inf counts go as one `nonfinite` tag.
  std::array<bool, kStatsFields> written_{};
  bool nonfinite_ = false;
  // Prefixes `<kind>/<name>` whose nonfinite count has been nonzero: their
  // tag is written from then on, 0 included.
  std::unordered_set<std::string> gone_nonfinite_;
  std::vector<std::pair<std::string, float>> scalars_;  // reused
  // Names of kind tensor seen as 0-d scalars and with statistics rows.
  std::unordered_set<std::string> scalar_names_, statistics_names_;
  std::unordered_set<std::string> charted_[3];
  bool charts_norm_ = false, charts_std_ = false, layout_due_ = false;
  std::int64_t last_step_ = 0;
};

}  // namespace tensortap::detail
