#include "sdk/src/sinks/budget.h"

#include <fcntl.h>
#include <sys/stat.h>

#include <algorithm>
#include <cstdio>
#include <exception>

#include <fmt/format.h>

#include "sdk/src/sinks/store.h"

namespace tensortap::detail {
namespace {

// What a record adds besides its bytes: its .npy header (64 to a few
// hundred bytes), alignment, its index line.
constexpr std::uint64_t kRecordOverhead = 512;
// run.json at its most: its options, counters and the last 1,000 dumps.
constexpr std::uint64_t kRunJsonAtMost = 160 << 10;

}  // namespace

DiskBudget::DiskBudget(const Options& options, std::string run_dir, const Dir& dir, const Store& store)
    : max_(options.max_bytes()),
      reserve_(options.max_bytes() / 20),
      policy_(options.on_budget()),
      run_dir_(std::move(run_dir)),
      dir_(dir),
      store_(store),
      dump_share_(options.max_bytes() / 100 * options.dumps_percent() +
                  options.max_bytes() % 100 * options.dumps_percent() / 100) {}

void DiskBudget::measure() {
  if (!on()) return;
  rescan();
  // KeepLatest: statistics, TensorBoard's events and the lines files grow
  // between records; old steps make room for them as for records.
  if (policy_ != Budget::KeepLatest || used_ <= max_) return;
  const std::uint64_t over = used_ - max_;
  // The steps before the newest full record's make room first, every
  // output of theirs. If they cannot (full capture paused, or never on),
  // the oldest statistics segments and event files go, up to the newest
  // step's: the newest full records stay, whatever follows them.
  if (newest_ >= 0 && make_room(over, over + max_ / 16, keep_from())) return;
  if (side_newest_ > newest_) make_side_room(over + max_ / 16);
}

void DiskBudget::rescan() {
  const Dir& dir = dir_;
  // The top of the run directory holds a dozen of tensortap's files (run.json,
  // the lines files, stats.npy, events, tensors.h5, the index's segments):
  // their sizes, and the directories' own. What lies below (npy/, packed/)
  // the writer counts as it writes, without a walk over millions of files.
  std::uint64_t top = 0;
  std::uint64_t rolling = 0, listed = 0;
  for (const std::string& name : dir.list()) {
    struct stat st {};
    if (::fstatat(dir.fd(), name.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0) continue;
    if (!S_ISREG(st.st_mode) && !S_ISDIR(st.st_mode)) continue;
    // control/ holds the requests other processes (tensortap ctl) write:
    // its size is theirs, unbounded by anything tensortap does (a flood of
    // 4,000 waiting requests grows it by 136 KiB, and ext4 never shrinks a
    // directory), so it would spend the statistics' reserve at random.
    if (name == "control" && S_ISDIR(st.st_mode)) continue;
    const auto size = static_cast<std::uint64_t>(st.st_size);
    top += size;
    if (is_rolling_lines_file(name)) rolling += size;
    if (name == "run.json") listed = size;
  }
  // StopCapture: what grows with requests and dumps after full capture
  // stopped counts at its most from the start: the lines files that roll
  // (control answers, dumps' lines: two generations each) and run.json
  // (its list of the last 1,000 dumps), so that a flood cannot spend the
  // statistics' reserve. (KeepLatest gives old steps up for them.)
  if (policy_ == Budget::StopCapture) {
    top += 4 * lines_roll_bytes() - std::min(rolling, 4 * lines_roll_bytes());
    top += kRunJsonAtMost - std::min(listed, kRunJsonAtMost);
  }
  struct stat self {};
  if (::fstat(dir.fd(), &self) == 0) top += static_cast<std::uint64_t>(self.st_size);
  top_ = top;
  used_ = written();
}

std::uint64_t DiskBudget::written() const {
  // The index lines still waiting for their records to be durable count
  // too: they reach the disk at the next sync, perhaps after the last
  // admission (a run's end), when nothing would make room for them.
  return top_ + store_.writer().disk_bytes() + store_.unwritten_index_bytes();
}

void DiskBudget::refuse(std::uint64_t nbytes) {
  refused_records_.fetch_add(1, std::memory_order_relaxed);
  refused_bytes_.fetch_add(nbytes, std::memory_order_relaxed);
}

bool is_rolling_lines_file(const std::string& name) {
  return name == "control.jsonl" || name == "control.1.jsonl" || name == "dumps.jsonl" || name == "dumps.1.jsonl";
}

bool DiskBudget::admit(std::uint64_t nbytes, std::int64_t step) {
  if (!on()) return true;
  const std::uint64_t need = nbytes + kRecordOverhead;
  // The estimate (a record's bytes and an overhead) misses what a record
  // adds besides (a new name's directory: 4 KiB): what the writer counts
  // (without a system call) corrects it at once, and before the budget
  // acts it looks at the disk.
  used_ = std::max(used_, written());
  if (used_ + need > max_ && !reached_.load(std::memory_order_relaxed)) rescan();
  if (policy_ == Budget::KeepLatest) {
    // A dump's records refused are counted apart too (dump_records_refused),
    // a dumped step's given up with the share's oldest (the rest of its
    // records, which come late) among them.
    const bool dumped = kept_.count(step) != 0 || step < dumps_given_up_below_.load(std::memory_order_relaxed);
    // A record of a step older than one admitted already (a capture
    // window's, arriving after a newer dump's): refused, it leaves the
    // newest steps as they are, and is counted apart (late_records_refused).
    const bool late = step < newest_;
    const auto refuse_it = [&] {
      refuse(nbytes);
      if (dumped) dump_refused_.fetch_add(1, std::memory_order_relaxed);
      else if (late) late_refused_.fetch_add(1, std::memory_order_relaxed);
      return false;
    };
    // A late record of a step given up (not a dumped one) would only be hidden.
    if (given_up(step)) return refuse_it();
    newest_ = std::max(newest_, step);
    // A dumped step's records count against the dumps' share: the oldest
    // dumped steps go first, this one too if the dump is larger than it.
    if (kept_.count(step) != 0) {
      kept_bytes_[step] += need;
      kept_total_ += need;
      fit_dumps(dump_share_);
      if (given_up(step)) return refuse_it();
    }
    if (used_ + need > max_) {
      said_reached(step);
      make_room_for(need, step, dumped);
    }
    // A late record of a step just given up (a dumped step stays).
    if (given_up(step)) return refuse_it();
    if (used_ + need <= max_) {
      used_ += need;
      return true;
    }
    refuse_it();
    if (!said_no_room_ && !give_up_failed_) {
      said_no_room_ = true;
      // What holds the room, so that a budget too small for its job can be
      // told from one that keeps too much.
      const std::string held = fmt::format(
          "{} bytes in use: {} in the files at the run's top (statistics, events, lines files, run.json), {} in "
          "records written, {} in index lines to come; dumped steps {} ({} bytes); steps below {} given up, the "
          "newest admitted {}",
          used_, top_, store_.writer().disk_bytes(), store_.unwritten_index_bytes(), kept_.size(), kept_total_,
          given_up_below_.load(std::memory_order_relaxed), newest_);
      std::fprintf(stderr,
                   "tensortap: warning: run '%s': a record of step %lld (%llu bytes) does not fit its disk budget of "
                   "%llu bytes, and giving up every older step (dumped steps within their share stay) would not make "
                   "room (%s); such records are refused (Counters::budget_refused)\n",
                   run_dir_.c_str(), static_cast<long long>(step), static_cast<unsigned long long>(nbytes),
                   static_cast<unsigned long long>(max_), held.c_str());
    }
    return false;
  }
  if (!reached() && used_ + need <= max_) {
    used_ += need;
    return true;
  }
  refuse(nbytes);
  if (!reached_.exchange(true)) said_reached(step);
  return false;
}

void DiskBudget::said_reached(std::int64_t record_step) {
  // The job's step: a record may be of an older one (a dumped step).
  const std::int64_t step = std::max(job_step(record_step), record_step);
  std::int64_t none = -1;
  if (!reached_at_step_.compare_exchange_strong(none, step, std::memory_order_relaxed)) return;
  std::fprintf(stderr,
               policy_ == Budget::KeepLatest
                   ? "tensortap: warning: run '%s' reached its disk budget of %llu bytes (Options::max_bytes) at step "
                     "%lld: the oldest steps are given up to make room (Budget::KeepLatest; run.json's "
                     "\"given_up_below\"); dumped steps stay within their share (Options::dumps_percent)\n"
                   : "tensortap: warning: run '%s' reached its disk budget of %llu bytes (Options::max_bytes) at step "
                     "%lld: full tensors stop (Budget::StopCapture); statistics, TensorBoard and the rules go on within "
                     "5%% more\n",
               run_dir_.c_str(), static_cast<unsigned long long>(max_), static_cast<long long>(step));
}

void DiskBudget::make_room_for(std::uint64_t need, std::int64_t step, bool dumped) {
  // Each way of making room in turn, measured again after each: a give-up
  // measures the run directory, which may hold more than the estimate said
  // (statistics, events and index lines grown since the last measure), so a
  // way that freed what it planned can still leave the record short.
  // Bounded: each round gives something up, or the loop ends.
  for (int round = 0; round < 8 && used_ + need > max_; ++round) {
    const std::uint64_t over = used_ + need - max_;
    // A sixteenth of the budget more than needed: a give-up (run.json
    // rewritten, files deleted) once in many records, not at each.
    const std::uint64_t want = over + max_ / 16;
    // Older steps first. The newest step written stays if they make room;
    // if they cannot (a step near the budget's size), the oldest statistics
    // segments and event files go, which newer steps' statistics would take
    // in turn; then that step too, so that this newer step's records are
    // not refused.
    const std::int64_t keep = keep_from();
    if (make_room(over, want, keep)) continue;
    if (make_side_room(want)) continue;
    if (keep < newest_ && make_room(over, want, newest_)) continue;
    // Last, a newer step that still does not fit next to the dumps takes
    // room from the oldest dumped steps (older than it), within their
    // share. Those above the marker become old steps like any other, which
    // the next round gives up.
    if (dumped || kept_total_ == 0) break;
    const std::uint64_t kept_before = kept_total_;
    fit_dumps(kept_total_ > over ? kept_total_ - over : 0, step);
    if (kept_total_ == kept_before) break;
  }
}

bool DiskBudget::make_room(std::uint64_t need, std::uint64_t want, std::int64_t limit) {
  if (!give_up_hooks_.plan || give_up_failed_) return false;
  const std::int64_t marked = given_up_below_.load(std::memory_order_relaxed);
  const std::int64_t from = std::max<std::int64_t>(marked, 0);
  // The plan counts files left below the marker too (a record that
  // finished after its step was given up): they go without a new marker.
  const Writer::GiveUp g = give_up_hooks_.plan(want, from, limit, kept_);
  // Nothing to give, or not enough to matter: the newest steps stay.
  if (g.bytes == 0 || g.bytes < need) return false;
  const bool mark = g.below > marked && g.below > 0;
  if (mark) given_up_below_.store(g.below, std::memory_order_relaxed);
  try {
    give_up_hooks_.apply(g.below, kept_, mark);
  } catch (const std::exception& e) {
    // run.json could not say it (a full disk): nothing was deleted, and
    // nothing will be; what does not fit is refused from now on.
    given_up_below_.store(marked, std::memory_order_relaxed);
    give_up_failed_ = true;
    std::fprintf(stderr,
                 "tensortap: warning: run '%s' cannot give up old steps (Budget::KeepLatest): run.json could not "
                 "say so first (%s); records that do not fit its disk budget are refused from now on\n",
                 run_dir_.c_str(), e.what());
    return false;
  }
  rescan();
  return true;
}

std::int64_t DiskBudget::keep_from() const {
  // The newest step with a record written stays until a newer one has its
  // own: a give-up at a step's first record would otherwise leave no step
  // to show (a reader opening the run then, or a job killed then, would find
  // it empty) until that record's line is durable.
  const std::int64_t written = store_.newest_written();
  return written >= 0 ? std::min(newest_, written) : newest_;
}

bool DiskBudget::make_side_room(std::uint64_t want) {
  if (!give_up_hooks_.side || give_up_failed_ || side_newest_ < 0) return false;
  // The files being written (the newest step's) stay.
  const std::uint64_t freed = give_up_hooks_.side(want, side_newest_);
  if (freed > 0) rescan();
  return freed > 0;
}

void DiskBudget::keep_steps(const std::vector<std::int64_t>& steps) {
  for (std::int64_t step : steps) {
    if (step < dumps_given_up_below_.load(std::memory_order_relaxed) || !kept_.insert(step).second) continue;
    // Records written before the dump (a sampled step, a capture window)
    // stay with it: uncounted, they would hold the share's room past it
    // and leave none for the newest steps (seen in the soak: two such
    // steps and the newest one filled a 1 MiB budget).
    if (const std::uint64_t held = store_.writer().bytes_held_by(step); held > 0) {
      kept_bytes_[step] += held;
      kept_total_ += held;
    }
  }
  if (policy_ == Budget::KeepLatest) fit_dumps(dump_share_);
}

void DiskBudget::fit_dumps(std::uint64_t share, std::int64_t before) {
  // The newest step with a record written stays (until a newer one has its
  // own), as in make_room(): a run that shows only dumped steps would
  // otherwise show none between this give-up and the next record's line.
  const std::int64_t written = store_.newest_written();
  if (written >= 0) before = std::min(before, written);
  bool gone = false;
  const std::int64_t marked = given_up_below_.load(std::memory_order_relaxed);
  while (kept_total_ > share && !kept_.empty() && *kept_.begin() < before) {
    const std::int64_t oldest = *kept_.begin();
    kept_.erase(kept_.begin());
    const auto it = kept_bytes_.find(oldest);
    if (it != kept_bytes_.end()) {
      kept_total_ -= it->second;
      kept_bytes_.erase(it);
    }
    dumps_given_up_below_.store(std::max(dumps_given_up_below_.load(std::memory_order_relaxed), oldest + 1),
                                std::memory_order_relaxed);
    gone = gone || oldest < marked;
  }
  if (!gone || !give_up_hooks_.apply || give_up_failed_) return;
  // Dumped steps below the marker are given up now: run.json says so
  // first (the readers hide them), then their files go.
  try {
    give_up_hooks_.apply(marked, kept_, /*mark=*/true);
  } catch (const std::exception& e) {
    give_up_failed_ = true;
    std::fprintf(stderr,
                 "tensortap: warning: run '%s' cannot give up old dumped steps (Budget::KeepLatest): run.json could "
                 "not say so first (%s); records that do not fit its disk budget are refused from now on\n",
                 run_dir_.c_str(), e.what());
    return;
  }
  rescan();
}

std::string DiskBudget::dump_refusal() const {
  if (policy_ == Budget::StopCapture)
    return fmt::format("the disk budget of {} bytes is reached (stop_capture)", max_);
  return fmt::format("beyond the dumps' share of the disk budget ({} bytes, Options::dumps_percent) or the budget "
                     "itself",
                     dump_share_);
}

bool DiskBudget::side_files_allowed() {
  if (!on() || used_ <= max_ + reserve_) {
    if (side_stopped_.load(std::memory_order_relaxed)) {
      // Room came back (KeepLatest gave steps up, or files went): said.
      side_stopped_.store(false, std::memory_order_relaxed);
      resumed_at_.store(job_step(0), std::memory_order_relaxed);
      monitoring_changed_ = true;
      std::fprintf(stderr, "tensortap: run '%s': statistics and TensorBoard's events resume at step %lld\n",
                   run_dir_.c_str(), static_cast<long long>(resumed_at_.load(std::memory_order_relaxed)));
    }
    return true;
  }
  if (!side_stopped_.load(std::memory_order_relaxed)) {
    side_stopped_.store(true, std::memory_order_relaxed);
    stopped_at_.store(job_step(0), std::memory_order_relaxed);
    resumed_at_.store(-1, std::memory_order_relaxed);
    monitoring_changed_ = true;
    if (!said_reserve_) {
      said_reserve_ = true;
      std::fprintf(stderr,
                   "tensortap: warning: run '%s' used its disk budget and its reserve of 5%% (%llu bytes in all) at "
                   "step %lld: statistics, TensorBoard's events and dumps stop too (run.json's \"monitoring\", "
                   "tensortap ctl status)\n",
                   run_dir_.c_str(), static_cast<unsigned long long>(max_ + reserve_),
                   static_cast<long long>(stopped_at_.load(std::memory_order_relaxed)));
    }
  }
  return false;
}

std::string DiskBudget::stopped_reason() const {
  return fmt::format("the disk budget and its 5% reserve are used ({} bytes, {})", max_ + reserve_,
                     policy_ == Budget::KeepLatest ? "keep_latest: no older step left to give up"
                                                   : "stop_capture");
}

std::vector<std::int64_t> DiskBudget::kept_below() const {
  std::vector<std::int64_t> out;
  const std::int64_t marked = given_up_below_.load(std::memory_order_relaxed);
  for (std::int64_t k : kept_) {
    if (k >= marked) break;
    out.push_back(k);
  }
  return out;
}

BudgetState DiskBudget::state() const {
  BudgetState s;
  s.max_bytes = max_;
  s.policy = policy_;
  s.reached_at_step = reached_at_step_.load(std::memory_order_relaxed);
  s.refused_records = refused_records_.load(std::memory_order_relaxed);
  s.refused_bytes = refused_bytes_.load(std::memory_order_relaxed);
  s.given_up_below = given_up_below_.load(std::memory_order_relaxed);
  s.dumps_given_up_below = dumps_given_up_below_.load(std::memory_order_relaxed);
  s.dump_records_refused = dump_refused_.load(std::memory_order_relaxed);
  s.late_records_refused = late_refused_.load(std::memory_order_relaxed);
  s.statistics_stopped_at = stopped_at_.load(std::memory_order_relaxed);
  s.resumed_at = resumed_at_.load(std::memory_order_relaxed);
  if (s.statistics_stopped_at >= 0) s.stopped_reason = stopped_reason();
  return s;
}

}  // namespace tensortap::detail
