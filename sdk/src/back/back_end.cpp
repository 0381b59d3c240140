#include "sdk/src/back/back_end.h"

#include "sdk/src/cuda/capture.h"

namespace tensortap::detail {
namespace {

RunInfo run_info(const Placement& p) {
  RunInfo info;
  info.run_dir = p.run_dir;
  info.rank = p.rank;
  info.world_size = p.world_size;
  info.options_from_env = p.options_from_env;
  return info;
}

}  // namespace

BackEnd::BackEnd(const Options& options, const Placement& placement, Staging& staging, Failures& failures,
                 std::function<std::int64_t()> step_now)
    : staging_(staging), manifest_(options, run_info(placement)) {
  // Opened once: everything is written through this descriptor, so a
  // chdir() or a link planted in the directory cannot move the run.
  run_dir_ = std::make_unique<RunDir>(options.dir(), placement.sub_dir, options.overwrite(), placement.world_size);
  const Dir& dir = run_dir_->dir();
  auto writer = make_writer(options.format(), options.hdf5(), options.packed(), dir);
  manifest_.open(dir);
  store_ = std::make_unique<Store>(std::move(writer), std::make_unique<LinesFile>(dir, "index.jsonl"), failures);
  budget_ = std::make_unique<DiskBudget>(options, placement.run_dir, dir, store_->writer());
  if (budget_->on()) store_->set_budget(budget_.get());
  stats_ = std::make_unique<StatsFile>(dir);
  if (options.tensorboard()) tensorboard_ = std::make_unique<TensorBoard>(dir, *options.tensorboard());
  flight_ = std::make_unique<FlightRecorder>(options, *store_, manifest_, failures);
  flight_->set_tensorboard(tensorboard_.get());
  if (options.stall_after().count() > 0)
    watchdog_ = std::make_unique<Watchdog>(options.stall_after(), std::move(step_now), staging.waits());
  thread_ = std::make_unique<WriterThread>(staging, *store_, *stats_, *flight_, failures, tensorboard_.get(),
                                           budget_->on() ? budget_.get() : nullptr,
                                           watchdog_ ? std::function<void()>([this] { on_wake(); }) : nullptr);
  // Device memory that snapshots may hold, per GPU: as much as host staging.
  cuda_ = make_cuda_engine(staging, 2 * options.buffer_bytes(),
                           [&failures](const std::string& what) { failures.add(nullptr, what, 1); });
}

BackEnd::~BackEnd() { stop(); }

void BackEnd::on_wake() {
  const auto now = std::chrono::steady_clock::now();
  if (watchdog_)
    if (std::optional<Dump> stall = watchdog_->check(now)) flight_->side_dump(std::move(*stall));
}

void BackEnd::flush(bool index) {
  if (cuda_) cuda_flush(*cuda_);
  staging_.wait_drained();
  if (index) thread_->sync();
}

void BackEnd::stop() {
  if (cuda_) cuda_stop(*cuda_);
  thread_->stop();
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
