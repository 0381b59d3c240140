#pragma once

// Reading one row of `tensors.h5` back (tensortap::load_params): the
// record's own shape in the top-left corner of its row.

#include <cstdint>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include "writers/src/dtypes.h"
#include "writers/src/file.h"

namespace tensortap::detail {

/// The record in row `row` of `dataset` of the HDF5 file `file` of `dir`,
/// of `shape`, as its bytes are stored (`info.stored`). Throws `Error`
/// naming `where` for a link, a rollback journal left by a crash (read that
/// run with the Python reader), or an HDF5 failure.
at::Tensor read_hdf5_row(const Dir& dir, const std::string& file, const std::string& dataset, std::int64_t row,
                         const std::vector<std::int64_t>& shape, const DtypeInfo& info, const std::string& where);

}  // namespace tensortap::detail
