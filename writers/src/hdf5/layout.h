#pragma once

// How tensortap calls HDF5 and lays a series out in `tensors.h5` (see
// Hdf5Writer for the layout): the lock every call takes, the wrapping that
// names the file and object in a failure, the types h5py reads back, and the
// group and datasets of one series.

#include <cstddef>
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include <H5Cpp.h>
#include <c10/util/ArrayRef.h>

#include <tensortap/error.h>
#include <tensortap/format.h>

#include "writers/src/check.h"
#include "writers/src/writer.h"

namespace tensortap::detail {

/// The lock every HDF5 call in the process holds: the HDF5 library Debian
/// ships is not thread-safe, and two recorders have two writer threads.
std::mutex& hdf5_mutex();

/// A failure of the HDF5 library itself (as opposed to a record it
/// refuses): the file's state is in doubt from then on.
class Hdf5Failure : public Error {
 public:
  using Error::Error;
};

/// Runs `f`, turning an HDF5 failure into an `Hdf5Failure` that names the
/// file, the object and what was being done.
template <class F>
auto wrap(const std::string& file, const std::string& object, const char* action, F&& f) -> decltype(f()) {
  try {
    return f();
  } catch (const H5::Exception& e) {
    fail<Hdf5Failure>("HDF5: cannot {} '{}' in '{}': {} ({})", action, object, file, e.getDetailMsg(), e.getFuncName());
  }
}

/// Makes the group (or file: the root group) created with `plist` keep its
/// links in dense storage (a fractal heap and a B-tree) from the first link.
/// HDF5 1.10 does not support making objects in SWMR-write mode, and 1.10.8
/// shows it: with links stored compactly in the group's object header,
/// adding series to a kind group between flushes makes a later H5Fflush fail
/// ("slist not empty (2)" in H5C_set_slist_enabled(): dirty metadata left
/// after the flush), after which the file can be neither flushed nor closed.
/// A plain C replay of the writer's calls fails that way every time; with
/// dense links it has not failed once (the object header no longer grows
/// with the links).
void set_dense_links(hid_t plist);
/// Creates `path` as a group with dense links (set_dense_links()).
H5::Group create_group(H5::H5File& file, const std::string& path);

/// One `/<kind>/<name>` group of `tensors.h5`.
struct Hdf5Series {
  /// Its path in the file, `/<kind>/<encoded name>`.
  std::string group;
  /// What its rows hold, and the dtype's name (the group's attribute).
  Element element;
  std::string dtype;
  std::size_t rank;
  /// The extent of `data`: rows (those in flight, and those of records that
  /// failed, included: their step stays -1), then the largest shape seen.
  std::vector<hsize_t> extent;
  /// The next row to hand out: a record claims its row when it begins.
  hsize_t next_row = 0;
  /// `data`'s chunk dimensions (rows first).
  std::vector<hsize_t> chunk;
  /// Open from the series' creation to the file's close.
  H5::DataSet data, steps, shapes;
};

/// `data`'s chunk dimensions (rows first) for records like `first`: about
/// `options.chunk_bytes()`, or, when that is 0, sized from the record (see
/// Hdf5Options::chunk_bytes).
std::vector<hsize_t> data_chunk(const RecordDesc& first, const Hdf5Options& options);

/// The bytes of one chunk of dimensions `chunk` holding `stored` elements.
std::uint64_t chunk_bytes(const std::vector<hsize_t>& chunk, Element stored);

/// The raw-data chunk cache of a `data` dataset chunked as `chunk`: one
/// chunk when rows share it, none (writes go straight to the file) when a
/// row fills its chunks itself.
std::size_t chunk_cache_bytes(const std::vector<hsize_t>& chunk, Element stored);

/// Sampled steps between two flushes, when Hdf5Options::flush_every is 0,
/// for records of `mean_record_bytes` on average: 1 from 64 KiB, up to 8
/// for smaller ones.
std::int64_t auto_flush_steps(std::uint64_t mean_record_bytes);

/// The file type of each stored element, the way h5py writes (and reads)
/// it; also the memory type a reader asks for, which gives the same bytes.
H5::DataType file_type(Element e);

/// Writes the file's attributes: the tensortap, torch and format versions.
void write_file_attributes(H5::H5File& file);

/// Creates the group `s.group` (and its kind's group, if new) for records
/// like `first`: its attributes, and its datasets, empty, chunked and
/// filtered as `options` say; `s` gets the datasets and the chunk shape.
/// HDF5 failures come out as H5::Exception: the caller wraps the call.
void create_series_group(H5::H5File& file, const RecordDesc& first, const Hdf5Options& options, Hdf5Series& s);

/// The file space a record of `shape` in row `row` of `s` may newly take:
/// the chunks of its row group, when it is the group's first row.
std::uint64_t new_chunk_bytes(const Hdf5Series& s, c10::IntArrayRef shape, hsize_t row);

}  // namespace tensortap::detail
