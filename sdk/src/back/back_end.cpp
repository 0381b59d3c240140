#include "sdk/src/back/back_end.h"

#include <sys/random.h>

#include <algorithm>
#include <cstdint>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "sdk/src/cuda/capture.h"
#include "sdk/src/run/environment.h"

namespace tensortap::detail {
namespace {

// 128 random bits in hex: the run's id (run.json's "run_id"), which a ctl
// request must carry.
std::string new_run_id() {
  unsigned char bytes[16] = {};
  std::size_t got = 0;
  while (got < sizeof(bytes)) {
    const ssize_t n = ::getrandom(bytes + got, sizeof(bytes) - got, 0);
    if (n > 0) got += static_cast<std::size_t>(n);
    else if (errno != EINTR) break;
  }
  std::string hex;
  for (unsigned char b : bytes) hex += fmt::format("{:02x}", b);
  return hex;
}

RunInfo run_info(const Placement& p) {
  RunInfo info;
  info.run_id = new_run_id();
  info.run_dir = p.run_dir;
  info.rank = p.rank;
  info.world_size = p.world_size;
  info.options_from_env = p.options_from_env;
  return info;
}

}  // namespace

BackEnd::BackEnd(const Options& options, const Placement& placement, Staging& staging, Failures& failures,
                 FrontSide front)
    : staging_(staging), manifest_(options, run_info(placement)), front_(std::move(front)), clock_(front_.step) {
  // Opened once: everything is written through this descriptor, so a
  // chdir() or a link planted in the directory cannot move the run.
  run_dir_ = std::make_unique<RunDir>(options.dir(), placement.sub_dir, options.overwrite(), placement.world_size);
  const Dir& dir = run_dir_->dir();
  auto writer = make_writer(options.format(), options.hdf5(), options.packed(), dir);
  manifest_.open(dir);
  store_ = std::make_unique<Store>(std::move(writer), std::make_unique<LinesFile>(dir, "index.jsonl"), failures);
  budget_ = std::make_unique<DiskBudget>(options, placement.run_dir, dir, *store_);
  if (budget_->on()) store_->set_budget(budget_.get());
  budget_->set_job_step(front_.step);
  if (budget_->on() && options.on_budget() == Budget::KeepLatest) {
    store_->keep_latest(dir, options.max_bytes());
    budget_->set_give_up(give_up_hooks(failures));
  }
  stats_ = std::make_unique<StatsFile>(dir);
  if (options.tensorboard()) tensorboard_ = std::make_unique<TensorBoard>(dir, *options.tensorboard());
  if (budget_->on() && options.on_budget() == Budget::KeepLatest) {
    // Small enough that a give-up (a 16th of the budget) frees whole files.
    stats_->keep_latest(std::max<std::uint64_t>(options.max_bytes() / 32, 16384));
    if (tensorboard_) tensorboard_->keep_latest(std::max<std::uint64_t>(options.max_bytes() / 16, 16384));
  }
  flight_ = std::make_unique<FlightRecorder>(options, *store_, manifest_, failures);
  flight_->set_tensorboard(tensorboard_.get());
  if (options.stall_after().count() > 0)
    watchdog_ = std::make_unique<Watchdog>(options.stall_after(), clock_, staging.waits());
  ControlChannel::Hooks hooks;
  hooks.step = front_.step;
  hooks.dump = [this](std::int64_t step) { return request_dump(step); };
  hooks.status = [this] { return status(); };
  // The lines files that grow with requests and dumps roll (docs/design.md, "Leaving it on").
  if (budget_->on()) {
    hooks.roll_bytes = budget_->lines_roll_bytes();
    manifest_.roll_dumps_at(hooks.roll_bytes);
  }
  control_ = std::make_unique<ControlChannel>(dir, manifest_.run_id(), std::move(hooks));
  thread_ = std::make_unique<WriterThread>(staging, *store_, *stats_, *flight_, failures, tensorboard_.get(),
                                           budget_->on() ? budget_.get() : nullptr, [this] { on_wake(); });
  // Device memory that snapshots may hold, per GPU: as much as host staging.
  cuda_ = make_cuda_engine(staging, 2 * options.buffer_bytes(),
                           [&failures](const std::string& what) { failures.add(nullptr, what, 1); },
                           cuda_stats_in_arena(), cuda_batch());
}

DiskBudget::GiveUpHooks BackEnd::give_up_hooks(Failures& failures) {
  DiskBudget::GiveUpHooks hooks;
  hooks.plan = [this](std::uint64_t want, std::int64_t from, std::int64_t limit,
                      const std::set<std::int64_t>& kept) { return plan_give_up(want, from, limit, kept); };
  hooks.apply = [this, &failures](std::int64_t below, const std::set<std::int64_t>& kept, bool mark) {
    // The newest records are durable and indexed first, then the run
    // says it: a crash between any two leaves the newest steps readable
    // and files the readers hide, never an index line whose file is gone
    // unsaid.
    if (mark) {
      store_->make_durable_before_give_up();
      manifest_.write_budget(budget_state());
    }
    // One marker for every output: the steps' records, then their
    // statistics segments and event files. What could not be deleted
    // stays, counted, and hidden all the same.
    const auto each = [&failures](auto&& give_up) {
      try {
        give_up();
      } catch (...) {
        failures.add(nullptr, Failures::current(), 0);
      }
    };
    each([&] { store_->give_up(below, kept); });
    each([&] { stats_->give_up(below); });
    if (tensorboard_) each([&] { tensorboard_->give_up(below); });
  };
  hooks.side = [this, &failures](std::uint64_t want, std::int64_t limit) {
    // The smallest step below which the closed files free `want`.
    const auto freed = [&](std::int64_t below) {
      return stats_->bytes_below(below) + (tensorboard_ ? tensorboard_->bytes_below(below) : 0);
    };
    std::int64_t lo = -1, hi = limit;
    if (freed(hi) == 0) return std::uint64_t{0};
    while (hi - lo > 1) {
      const std::int64_t mid = lo + (hi - lo) / 2;
      (freed(mid) >= want ? hi : lo) = mid;
    }
    std::uint64_t n = 0;
    try {
      n += stats_->give_up(hi);
      if (tensorboard_) n += tensorboard_->give_up(hi);
    } catch (...) {
      failures.add(nullptr, Failures::current(), 0);
    }
    return n;
  };
  return hooks;
}

BackEnd::~BackEnd() { stop(); }

void BackEnd::on_wake() {
  const auto now = std::chrono::steady_clock::now();
  clock_.tick(now);
  // Statistics stopped or came back: run.json says so while the job runs,
  // not only at close (a killed job's run still tells).
  if (budget_->take_monitoring_change()) {
    try {
      manifest_.write_budget(budget_state());
    } catch (...) {
      // Said at close again; a full disk is why they stopped.
    }
  }
  // Taps declared since (watch()): run.json says them while the job runs,
  // so that the doctor reads them in a killed job's run too.
  if (manifest_.take_taps_change()) {
    try {
      manifest_.rewrite();
    } catch (...) {
      // Said at close again.
    }
  }
  if (watchdog_)
    if (std::optional<Dump> stall = watchdog_->check(now)) flight_->side_dump(std::move(*stall));
  control_->wake(now);
}

std::string BackEnd::request_dump(std::int64_t step) {
  Dump d;
  d.step = step;
  d.trigger = "request";
  d.reason = "request";
  // Answered once the dump's records are written or refused: it says
  // which steps it wrote and which it could not keep, and why.
  const Dump dump = flight_->side_dump(std::move(d));
  if (!flight_->holds()) return "the run is marked (dumps.jsonl); it has no flight recorder";
  std::string refused;
  if (!dump.refused_steps.empty()) {
    const std::vector<std::int64_t>& r = dump.refused_steps;
    const std::size_t shown = std::min<std::size_t>(r.size(), 8);
    refused = fmt::format("{} step(s) refused ({}{}): {}", r.size(),
                          fmt::join(r.begin(), r.begin() + static_cast<std::ptrdiff_t>(shown), ", "),
                          shown < r.size() ? ", ..." : "", dump.refused_reason);
  }
  if (dump.steps.empty())
    return refused.empty() ? "the run is marked (dumps.jsonl): the flight recorder held no step"
                           : "the run is marked (dumps.jsonl): " + refused;
  return fmt::format("the flight recorder dumped steps {}..{} ({} steps){}", dump.steps.front(), dump.steps.back(),
                     dump.steps.size(), refused.empty() ? "" : "; " + refused);
}

Writer::GiveUp BackEnd::plan_give_up(std::uint64_t want, std::int64_t from, std::int64_t limit,
                                     const std::set<std::int64_t>& kept) const {
  // What giving up the steps below `below` frees grows with it: the
  // smallest `below` that frees `want`, found by bisection (each count is
  // O(steps held), a give-up is rare).
  const auto freed = [&](std::int64_t below) {
    std::uint64_t n = store_->plan_give_up(UINT64_MAX, from, below, kept).bytes + stats_->bytes_below(below);
    if (tensorboard_) n += tensorboard_->bytes_below(below);
    return n;
  };
  limit = std::max(from, limit);
  if (std::uint64_t all = freed(limit); all < want) return Writer::GiveUp{limit, all};
  if (std::uint64_t now = freed(from); now >= want) return Writer::GiveUp{from, now};
  std::int64_t lo = from, hi = limit;  // freed(lo) < want <= freed(hi)
  while (hi - lo > 1) {
    const std::int64_t mid = lo + (hi - lo) / 2;
    (freed(mid) >= want ? hi : lo) = mid;
  }
  return Writer::GiveUp{hi, freed(hi)};
}

BudgetState BackEnd::budget_state() const {
  BudgetState s = budget_->state();
  s.stats_rows_given_up = stats_->rows_given_up();
  s.event_files_given_up = tensorboard_ ? tensorboard_->files_given_up() : 0;
  s.kept_below = budget_->kept_below();
  return s;
}

std::string BackEnd::status() const {
  const std::string budget =
      budget_->on() ? fmt::format("budget {}/{} ({})", budget_->used(), budget_->state().max_bytes,
                                  budget_->state().policy == Budget::KeepLatest ? "keep_latest" : "stop_capture")
                    : std::string("budget off");
  const double ago = clock_.step() < 0 ? 0.0
                                       : std::chrono::duration<double>(std::chrono::steady_clock::now() - clock_.since())
                                             .count();
  const std::string stopped = monitoring_stopped();
  const std::string monitoring = stopped.empty() ? stopped : "; " + stopped;
  return fmt::format("records {}, bytes {}, dropped {}, {}, last step {:.1f} s ago{}", store_->records(),
                     store_->bytes(), front_.dropped() + flight_->dropped(), budget, ago, monitoring);
}

std::string BackEnd::monitoring_stopped() const {
  if (!budget_->statistics_stopped()) return "";
  const BudgetState s = budget_->state();
  return fmt::format("statistics stopped at step {} ({})", s.statistics_stopped_at, s.stopped_reason);
}

void BackEnd::flush(bool index) {
  if (cuda_) cuda_flush(*cuda_);
  staging_.wait_drained();
  if (index) thread_->sync();
}

void BackEnd::stop() {
  if (cuda_) cuda_stop(*cuda_);
  thread_->stop();
  control_->close();
}

void BackEnd::close(const Counters& counters, const std::string& first_error) {
  flight_->on_close();
  if (budget_->on()) manifest_.set_budget(budget_state());
  try {
    manifest_.close(counters, first_error);
  } catch (...) {
    // The last write: let go of the directory and its lock either way.
    run_dir_->release();
    throw;
  }
  run_dir_->release();
}

}  // namespace tensortap::detail
