#include "sdk/src/manifest.h"

#include "writers/src/run_files.h"

namespace tensortap::detail {

void RunManifest::open(const Dir& dir) {
  std::lock_guard<std::mutex> lock(mu_);
  dir_ = &dir;
  info_.start_time = utc_now();
  write_run_json(*dir_, run_json(options_, info_));
}

void RunManifest::add_dump(const DumpRecord& dump) {
  std::lock_guard<std::mutex> lock(mu_);
  info_.dumps.push_back(dump);
  write_run_json(*dir_, run_json(options_, info_));
}

std::vector<DumpRecord> RunManifest::dumps() const {
  std::lock_guard<std::mutex> lock(mu_);
  return info_.dumps;
}

void RunManifest::close(const Stats& stats, const std::string& first_error) {
  std::lock_guard<std::mutex> lock(mu_);
  info_.closed = true;
  info_.end_time = utc_now();
  info_.stats = stats;
  info_.first_error = first_error;
  write_run_json(*dir_, run_json(options_, info_));
}

}  // namespace tensortap::detail
