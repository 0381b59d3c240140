#pragma once

// A disk budget (Options::max_bytes, on_budget; docs/leaving-it-on.md): the
// apparent size of this rank's run directory, every file tensortap writes
// counted, kept under the budget by the writer thread.

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include <tensortap/options.h>

#include "writers/src/file.h"
#include "writers/src/writer.h"

namespace tensortap::detail {

class Store;

/// A full-tensor record the budget has no room for: not a failure, counted
/// as `budget_refused` (Store::begin throws it, its callers catch it).
struct BudgetRefused {};

/// What run.json's "budget" says, and `Counters::budget_refused`.
struct BudgetState {
  std::uint64_t max_bytes = 0;
  Budget policy = Budget::StopCapture;
  std::int64_t reached_at_step = -1;
  std::int64_t refused_records = 0;
  std::uint64_t refused_bytes = 0;
  std::int64_t given_up_below = -1;
  /// KeepLatest: dumped steps below this were given up too (the dumps'
  /// share, oldest first); what the statistics segments and event files
  /// given up held (docs/design.md, "Leaving it on").
  std::int64_t dumps_given_up_below = -1;
  std::int64_t dump_records_refused = 0;  // of refused_records: a dump's beyond the share
  std::int64_t late_records_refused = 0;  // of refused_records: of a step older than one admitted
  /// The dumped steps below the marker that stay: run.json says them with
  /// the marker, so that a reader keeps them before their dump's line is
  /// written (a give-up while a dump writes its older held steps).
  std::vector<std::int64_t> kept_below;
  std::int64_t stats_rows_given_up = 0;
  std::int64_t event_files_given_up = 0;
  /// Statistics and TensorBoard's events stopped (budget and reserve
  /// used): the job's step then, why, and the step they came back at
  /// (-1: not since). run.json's "monitoring" (docs/design.md#runjson).
  std::int64_t statistics_stopped_at = -1;
  std::string stopped_reason;
  std::int64_t resumed_at = -1;
};

/// Whether `name` is one of the lines files that roll (control answers and
/// dumps' lines, either generation).
bool is_rolling_lines_file(const std::string& name);

/// Writer thread only, but `reached()` and `refused()` from any thread.
class DiskBudget {
 public:
  /// Off when `options.max_bytes()` is 0. `dir` (the rank's directory) and
  /// `store` (its records' writer and index) must outlive it.
  DiskBudget(const Options& options, std::string run_dir, const Dir& dir, const Store& store);

  bool on() const { return max_ != 0; }
  /// Where control.jsonl and dumps.jsonl roll (docs/design.md, "Leaving it on"): a 64th
  /// of the budget, 64 KiB at least. Each keeps one older generation, and
  /// the budget counts the four files at their most from the start.
  std::uint64_t lines_roll_bytes() const { return std::max<std::uint64_t>(max_ / 64, 64 << 10); }
  /// At a batch's start: the run directory's size as it is now (the files
  /// at its top by their sizes, and what the writer holds below them).
  void measure();
  /// Before a full-tensor record of `nbytes` of step `step` is written:
  /// whether it fits. StopCapture: if not, the record is refused (counted)
  /// and full capture stops from the next step on. KeepLatest: the oldest
  /// steps before `step` are given up to make room; a record that still
  /// does not fit, or of a step already given up, is refused (counted).
  bool admit(std::uint64_t nbytes, std::int64_t step);
  /// Whether statistics, TensorBoard's events and the lines files may still
  /// grow: under the budget and its reserve of 5% (KeepLatest: old steps
  /// make room for them first, at `measure()`).
  bool side_files_allowed();
  /// A statistics row or event of `step` is written (writer thread).
  void side_written(std::int64_t step) { side_newest_ = std::max(side_newest_, step); }
  /// Whether statistics are stopped now (any thread): `ctl`'s answers say so.
  bool statistics_stopped() const { return side_stopped_.load(std::memory_order_relaxed); }
  /// Whether monitoring stopped or resumed since the last call (writer
  /// thread): run.json is then rewritten to say so.
  bool take_monitoring_change() { return std::exchange(monitoring_changed_, false); }
  /// The job's step (the front end's), which "reached at step" and the
  /// monitoring marks name: a record's step may be older (a late dump).
  void set_job_step(std::function<std::int64_t()> step) { job_step_ = std::move(step); }

  /// KeepLatest: how steps are given up. `plan` is `Store::plan_give_up`;
  /// `apply(below, kept, mark)` says so durably first when `mark` (run.json's
  /// "given_up_below"; throwing if it could not: then nothing is deleted),
  /// then deletes their files (`Store::give_up`; without `mark`, files
  /// left below the marker already: a record that finished late).
  struct GiveUpHooks {
    std::function<Writer::GiveUp(std::uint64_t want, std::int64_t from, std::int64_t limit,
                                 const std::set<std::int64_t>& kept)>
        plan;
    std::function<void(std::int64_t below, const std::set<std::int64_t>& kept, bool mark)> apply;
    /// Gives up the oldest statistics segments and event files, of steps
    /// before `limit`, until `want` bytes are free (or all of them); the
    /// bytes freed. No marker: their steps' full records stay.
    std::function<std::uint64_t(std::uint64_t want, std::int64_t limit)> side;
  };
  void set_give_up(GiveUpHooks hooks) { give_up_hooks_ = std::move(hooks); }
  /// The steps a flight-recorder dump writes: kept while the dumps' share
  /// (Options::dumps_percent of the budget) holds them; the oldest dumped
  /// steps are given up first. What a step holds on disk already (its
  /// trigger step's records, a capture window's) counts in the share.
  void keep_steps(const std::vector<std::int64_t>& steps);
  /// Why a dumped step's records were refused, in words (a dump's answer).
  std::string dump_refusal() const;
  /// KeepLatest: whether `step`'s records are given up (below the marker,
  /// not dumped): their files go, and their index lines need not be written.
  bool given_up(std::int64_t step) const {
    return step < given_up_below_.load(std::memory_order_relaxed) && kept_.count(step) == 0;
  }

  /// KeepLatest: whether `step` is below the marker (its statistics rows
  /// and events, which no dump keeps, need not be written).
  bool below_marker(std::int64_t step) const { return step < given_up_below_.load(std::memory_order_relaxed); }

  /// Whether the budget stopped full capture (the front end asks at step()).
  bool reached() const { return reached_.load(std::memory_order_relaxed); }
  /// Bytes used as of the last `measure()` and admissions since (writer thread).
  std::uint64_t used() const { return used_; }
  std::int64_t refused() const { return refused_records_.load(std::memory_order_relaxed); }
  /// The counters and marks; any thread (`kept_below` is left empty).
  BudgetState state() const;
  /// The dumped steps below the marker that stay (writer thread).
  std::vector<std::int64_t> kept_below() const;
  /// Why statistics stopped, in words (`ctl status`, run.json).
  std::string stopped_reason() const;

 private:
  const std::uint64_t max_;
  const std::uint64_t reserve_;
  const Budget policy_;
  const std::string run_dir_;
  const Dir& dir_;
  const Store& store_;
  // The directory's size as last measured, plus what was admitted since.
  std::uint64_t used_ = 0;
  std::uint64_t top_ = 0;
  std::atomic<bool> reached_{false};
  std::atomic<std::int64_t> reached_at_step_{-1};
  std::atomic<std::int64_t> refused_records_{0};
  std::atomic<std::uint64_t> refused_bytes_{0};
  bool said_reserve_ = false;
  std::function<std::int64_t()> job_step_;
  std::int64_t job_step(std::int64_t fallback) const { return job_step_ ? job_step_() : fallback; }
  // Monitoring (statistics, TensorBoard's events): stopped now, and when.
  std::atomic<bool> side_stopped_{false};
  std::atomic<std::int64_t> stopped_at_{-1};
  std::atomic<std::int64_t> resumed_at_{-1};
  bool monitoring_changed_ = false;

  // KeepLatest: makes room for a record of `need` bytes of `step` (of a
  // dumped step: `dumped`) by every way there is, until it fits or none is left.
  void make_room_for(std::uint64_t need, std::int64_t step, bool dumped);
  // Gives up old steps (before `limit`) until `want` bytes are free, or
  // at least `need`; whether any went.
  bool make_room(std::uint64_t need, std::uint64_t want, std::int64_t limit);
  // Measures the run directory's size now (see measure()) into `used_`.
  void rescan();
  // The size as of the last rescan() at the top, and as the writer and the
  // index count below it now: never more than what is or will be on disk.
  std::uint64_t written() const;
  void refuse(std::uint64_t nbytes);
  void said_reached(std::int64_t step);

  // KeepLatest's state: how steps are given up, the steps given up (below
  // this), the newest step admitted, the dumped steps.
  GiveUpHooks give_up_hooks_;
  std::atomic<std::int64_t> given_up_below_{-1};
  std::int64_t newest_ = -1;
  std::set<std::int64_t> kept_;
  bool give_up_failed_ = false;
  bool said_no_room_ = false;
  // The dumps' share: its bytes, what the kept steps took (by step), and
  // the dumped steps given up (below this).
  const std::uint64_t dump_share_;
  std::map<std::int64_t, std::uint64_t> kept_bytes_;
  std::uint64_t kept_total_ = 0;
  std::atomic<std::int64_t> dumps_given_up_below_{-1};
  std::atomic<std::int64_t> dump_refused_{0};
  std::atomic<std::int64_t> late_refused_{0};
  // The newest step of a statistics row or event written (KeepLatest).
  std::int64_t side_newest_ = -1;
  // The step below which make_room() may give steps up: the newest step
  // admitted, or the newest with a record written if that is older.
  std::int64_t keep_from() const;
  // Gives up the oldest statistics segments and event files (no marker)
  // until `want` bytes are free; whether any went.
  bool make_side_room(std::uint64_t want);
  // Gives up the oldest dumped steps (before `before`) until the dumps
  // take `share` bytes at most.
  void fit_dumps(std::uint64_t share, std::int64_t before = INT64_MAX);
};

}  // namespace tensortap::detail
