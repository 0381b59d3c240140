#pragma once

#include <string>
#include <unordered_set>

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

 private:
  const Dir& dir_;
  // Directories already made, so mkdir runs once per (kind, name).
  std::unordered_set<std::string> made_;
  // The records' files (header and data) and the directories made, in bytes.
  std::uint64_t bytes_ = 0;
};

}  // namespace tensortap::detail
