#pragma once

// Reading a run back in C++ (tensortap::load_params): its index lines,
// parsed strictly, and a record's tensor from its file, through the run
// directory (no link followed, no path leaving it), in every format.

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <ATen/core/Tensor.h>
#include <tensortap/kinds.h>

#include "writers/src/file.h"

namespace tensortap::detail {

/// One line of index.jsonl (docs/design.md#the-index).
struct IndexRecord {
  std::int64_t step = 0;
  Kind kind = Kind::Tensor;
  std::string name;
  std::string dtype;  // PyTorch's name, as captured
  std::vector<std::int64_t> shape;
  std::string file;   // relative to the rank's directory
  std::optional<std::uint64_t> offset, nbytes;  // Format::Packed
  std::string dataset;                          // Format::Hdf5
  std::optional<std::int64_t> row;
};

/// Parses an index line; throws `Error` naming `where` (file and line) and
/// what it did not understand: a member it does not know, a value of the
/// wrong type, a missing member, anything after the object.
IndexRecord parse_index_line(std::string_view line, const std::string& where);

/// The directory of rank `rank` of the run at `path`: `rank<r>/` of a
/// multi-rank run, the run itself otherwise (then only rank 0). Throws
/// `Error` naming the path.
Dir open_rank_dir(const std::string& path, std::int64_t rank);

/// Every record of the index of `dir` (opened by `open_rank_dir`; `path`
/// for messages): index.jsonl, then its segments index.<n>.jsonl in order.
/// A last line cut short by a crash (no newline, not JSON) is left out; any
/// other line that does not parse throws.
std::vector<IndexRecord> read_index(const Dir& dir, const std::string& path);

/// run.json's "given_up_below" (Budget::KeepLatest: the steps below it were
/// given up, dumped steps aside), or -1 when it has none.
std::int64_t given_up_below(const Dir& dir);

/// Whether the record was captured as `dtype`; the name the index gives
/// `dtype` (PyTorch's Python name), for messages.
bool holds_dtype(const IndexRecord& record, c10::ScalarType dtype);
std::string index_dtype_name(c10::ScalarType dtype);

/// The record's tensor, of its captured dtype (bfloat16 widened on disk
/// comes back exactly; a float8's codes as the float8). Throws `Error`
/// naming the file for a path leaving the run, a link, a short or damaged
/// file, and for HDF5 in a build without it.
at::Tensor read_record(const Dir& dir, const std::string& path, const IndexRecord& record);

}  // namespace tensortap::detail
