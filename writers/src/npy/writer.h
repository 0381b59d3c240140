#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <unordered_set>
#include <vector>

#include "writers/src/file.h"
#include "writers/src/writer.h"

namespace tensortap::detail {

/// Writes each record as `npy/<kind>/<encoded name>/<step>.npy` under the
/// run directory.
class NpyWriter final : public Writer {
 public:
  explicit NpyWriter(const Dir& dir) : dir_(dir) {}
  std::unique_ptr<RecordSink> begin(const RecordDesc& meta) override;
  void close() override {}
  std::uint64_t disk_bytes() const override { return bytes_; }
  std::uint64_t bytes_held_by(std::int64_t step) const override;
  void keep_latest(std::uint64_t max_bytes) override {
    (void)max_bytes;
    keep_latest_ = true;
  }
  GiveUp plan_give_up(std::uint64_t want, std::int64_t from, std::int64_t limit,
                      const std::set<std::int64_t>& kept) const override;
  std::uint64_t give_up(std::int64_t below, const std::set<std::int64_t>& kept) override;

  /// A record's file, remembered under KeepLatest.
  struct StepFile {
    std::string rel;  // relative to the run directory
    std::uint64_t bytes;
  };
  /// Called by a sink as its record's file takes its name.
  void finished(std::int64_t step, std::string rel, std::uint64_t bytes);

 private:
  const Dir& dir_;
  // Directories already made, so mkdir runs once per (kind, name).
  std::unordered_set<std::string> made_;
  // The records' files (header and data) and the directories made, in bytes.
  std::uint64_t bytes_ = 0;
  // Budget::KeepLatest: each step's files, oldest step first.
  bool keep_latest_ = false;
  std::map<std::int64_t, std::vector<StepFile>> steps_;
};

}  // namespace tensortap::detail
