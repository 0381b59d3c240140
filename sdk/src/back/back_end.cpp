#include "sdk/src/back/back_end.h"

#include <sys/random.h>

#include <fmt/format.h>

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
    DiskBudget::GiveUpHooks hooks;
    hooks.plan = [this](std::uint64_t want, std::int64_t from, std::int64_t limit,
                        const std::set<std::int64_t>& kept) { return store_->plan_give_up(want, from, limit, kept); };
    hooks.apply = [this, &failures](std::int64_t below, const std::set<std::int64_t>& kept, bool mark) {
      // The newest records are durable and indexed first, then the run
      // says it: a crash between any two leaves the newest steps readable
      // and files the readers hide, never an index line whose file is gone
      // unsaid.
      if (mark) {
        store_->make_durable_before_give_up();
        manifest_.write_budget(budget_->state());
      }
      try {
        store_->give_up(below, kept);
      } catch (...) {
        // What could not be deleted stays, counted, and hidden all the same.
        failures.add(nullptr, Failures::current(), 0);
      }
    };
    budget_->set_give_up(std::move(hooks));
  }
  stats_ = std::make_unique<StatsFile>(dir);
  if (options.tensorboard()) tensorboard_ = std::make_unique<TensorBoard>(dir, *options.tensorboard());
  flight_ = std::make_unique<FlightRecorder>(options, *store_, manifest_, failures);
  flight_->set_tensorboard(tensorboard_.get());
  if (options.stall_after().count() > 0)
    watchdog_ = std::make_unique<Watchdog>(options.stall_after(), clock_, staging.waits());
  ControlChannel::Hooks hooks;
  hooks.step = front_.step;
  hooks.dump = [this](std::int64_t step) { return request_dump(step); };
  hooks.status = [this] { return status(); };
  control_ = std::make_unique<ControlChannel>(dir, manifest_.run_id(), std::move(hooks));
  thread_ = std::make_unique<WriterThread>(staging, *store_, *stats_, *flight_, failures, tensorboard_.get(),
                                           budget_->on() ? budget_.get() : nullptr, [this] { on_wake(); });
  // Device memory that snapshots may hold, per GPU: as much as host staging.
  cuda_ = make_cuda_engine(staging, 2 * options.buffer_bytes(),
                           [&failures](const std::string& what) { failures.add(nullptr, what, 1); },
                           cuda_stats_in_arena());
}

BackEnd::~BackEnd() { stop(); }

void BackEnd::on_wake() {
  const auto now = std::chrono::steady_clock::now();
  clock_.tick(now);
  // Statistics stopped or came back: run.json says so while the job runs,
  // not only at close (a killed job's run still tells).
  if (budget_->take_monitoring_change()) {
    try {
      manifest_.write_budget(budget_->state());
    } catch (...) {
      // Said at close again; a full disk is why they stopped.
    }
  }
  if (watchdog_)
    if (std::optional<Dump> stall = watchdog_->check(now)) flight_->side_dump(std::move(*stall));
  for (const ControlAnswer& applied : control_->wake(now)) {
    // A capture's window: stored even by a flight recorder, and its include.
    // Only a capture taken sets it (an every, a pause, a refusal leave a
    // running window as it is).
    if (!applied.ok || applied.command != "capture") continue;
    flight_->store_steps(applied.window_lo, applied.window_hi);
    thread_->set_window(applied.window_lo, applied.window_hi,
                        applied.include.empty() ? nullptr : std::make_unique<Pattern>(applied.include, "include"));
  }
}

std::string BackEnd::request_dump(std::int64_t step) {
  Dump d;
  d.step = step;
  d.trigger = "request";
  d.reason = "request";
  const std::vector<std::int64_t> steps = flight_->side_dump(std::move(d));
  if (!flight_->holds()) return "the run is marked (dumps.jsonl); it has no flight recorder";
  if (steps.empty()) return "the run is marked (dumps.jsonl): the flight recorder held no step";
  return fmt::format("the flight recorder dumped steps {}..{}", steps.front(), steps.back());
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
  if (budget_->on()) manifest_.set_budget(budget_->state());
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
