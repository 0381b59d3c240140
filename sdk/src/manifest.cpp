#include "sdk/src/manifest.h"

#include <algorithm>

namespace tensortap::detail {
namespace {

// What close() adds to run.json besides the dumps: the end time, the
// counters and the first error (2,000 characters, escaped).
constexpr std::uint64_t kCloseBytes = 16384;

}  // namespace

void RunManifest::open(const Dir& dir) {
  std::lock_guard<std::mutex> lock(mu_);
  dir_ = &dir;
  info_.start_time = utc_now();
  const std::string json = run_json(options_, info_);
  run_json_room_ = write_run_json(*dir_, json);
  run_json_need_ = json.size() + kCloseBytes;
}

void RunManifest::add_dump(const DumpRecord& dump) {
  std::string line;
  append_dump_json(line, dump);
  line += '\n';
  // The lines of dumps whose append failed (none, but after a full disk),
  // then this one.
  std::string lines;
  std::size_t total = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    info_.dumps.push_back(dump);
    total = info_.dumps.size();
    for (std::size_t i = appended_; i + 1 < total; ++i) {
      append_dump_json(lines, info_.dumps[i]);
      lines += '\n';
    }
  }
  lines += line;
  // The files outside the lock: dumps() (Recorder::dumps(), on the training
  // thread) never waits for the disk. Only the writer thread gets here.
  //
  // close() lists every dump in run.json: its blocks grow ahead of that
  // text, doubling (so a reservation once in many dumps), so that close()
  // can still rewrite it in place on a full disk.
  run_json_need_ += line.size() + 8;
  if (run_json_need_ > run_json_room_) {
    run_json_room_ = 2 * run_json_need_;
    reserve_run_json(*dir_, run_json_room_);
  }
  // Created at the first dump, exclusively: RunDir removed or refused any
  // file of that name when the run opened.
  if (!dumps_file_) dumps_file_ = std::make_unique<LinesFile>(*dir_, "dumps.jsonl");
  dumps_file_->append(lines);
  appended_ = total;
  // On disk before step() can see the dump and act on it.
  dumps_file_->datasync();
}

std::vector<DumpRecord> RunManifest::dumps(std::size_t limit) const {
  std::lock_guard<std::mutex> lock(mu_);
  const std::size_t n = std::min(limit, info_.dumps.size());
  return std::vector<DumpRecord>(info_.dumps.begin(), info_.dumps.begin() + static_cast<std::ptrdiff_t>(n));
}

DumpRecord RunManifest::last_dump(std::size_t limit) const {
  std::lock_guard<std::mutex> lock(mu_);
  const std::size_t n = std::min(limit, info_.dumps.size());
  return n > 0 ? info_.dumps[n - 1] : DumpRecord{};
}

void RunManifest::close(const Stats& stats, const std::string& first_error) {
  std::lock_guard<std::mutex> lock(mu_);
  // A closed run holds no file; the writer thread, which appends, has stopped.
  dumps_file_.reset();
  info_.closed = true;
  info_.end_time = utc_now();
  info_.stats = stats;
  info_.first_error = first_error;
  write_run_json(*dir_, run_json(options_, info_));
}

}  // namespace tensortap::detail
