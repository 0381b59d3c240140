#pragma once

#include <string>
#include <unordered_set>

#include "writers/src/writer.h"

namespace tensortap::detail {

/// Writes each record as `npy/<kind>/<encoded name>/<step>.npy` under the
/// run directory.
class NpyWriter final : public Writer {
 public:
  explicit NpyWriter(std::string dir);
  std::unique_ptr<RecordSink> begin(const RecordMeta& meta) override;
  void close() override {}

 private:
  std::string dir_;
  // Directories already made, so mkdir runs once per (kind, name).
  std::unordered_set<std::string> made_;
};

}  // namespace tensortap::detail
