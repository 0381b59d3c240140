#include "writers/src/hdf5/read.h"

#include <ATen/ATen.h>

#include "writers/src/check.h"
#include "writers/src/hdf5/layout.h"

namespace tensortap::detail {

at::Tensor read_hdf5_row(const Dir& dir, const std::string& file, const std::string& dataset, std::int64_t row,
                         const std::vector<std::int64_t>& shape, const DtypeInfo& info, const std::string& where) {
  // HDF5 opens by path, following links: the run's own file only.
  TENSORTAP_CHECK(!dir.is_link(file), "{}: '{}' is a symbolic link", where, dir.path_of(file));
  TENSORTAP_CHECK(!dir.exists("." + file + ".journal"),
                  "{}: '{}' has the rollback journal a crash left (its writer died making datasets): read this run "
                  "with the Python reader (tensortap.open), which reads the file as it was before",
                  where, dir.path_of(file));
  TENSORTAP_CHECK(row >= 0, "{}: a negative row", where);
  at::Tensor t = at::empty(shape, at::TensorOptions().dtype(info.stored));
  const std::string path = dir.path_of(file);
  std::lock_guard<std::mutex> lock(hdf5_mutex());
  wrap(path, dataset, "read a row of", [&] {
    H5::H5File f(path, H5F_ACC_RDONLY | H5F_ACC_SWMR_READ);
    H5::DataSet d = f.openDataSet(dataset);
    H5::DataSpace space = d.getSpace();
    const int rank = space.getSimpleExtentNdims();
    TENSORTAP_CHECK(rank == static_cast<int>(shape.size()) + 1, "{}: '{}' has {} axes, not {}", where, dataset, rank,
                    shape.size() + 1);
    std::vector<hsize_t> extent(static_cast<std::size_t>(rank));
    space.getSimpleExtentDims(extent.data());
    TENSORTAP_CHECK(static_cast<hsize_t>(row) < extent[0], "{}: '{}' has {} rows, no row {}", where, dataset,
                    extent[0], row);
    std::vector<hsize_t> start(extent.size(), 0), count(extent.size(), 1);
    start[0] = static_cast<hsize_t>(row);
    for (std::size_t i = 0; i < shape.size(); ++i) {
      TENSORTAP_CHECK(static_cast<hsize_t>(shape[i]) <= extent[i + 1], "{}: the record's shape is beyond '{}'",
                      where, dataset);
      count[i + 1] = static_cast<hsize_t>(shape[i]);
    }
    space.selectHyperslab(H5S_SELECT_SET, count.data(), start.data());
    const H5::DataSpace memory(static_cast<int>(count.size()), count.data());
    if (t.numel() > 0) d.read(t.data_ptr(), file_type(info.element), memory, space);
    return 0;
  });
  return t;
}

}  // namespace tensortap::detail
