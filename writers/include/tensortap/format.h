#pragma once

// What a run's files look like: the format and its settings. Part of
// writers/, which owns the files; Options (sdk) holds one of each.

#include <cstddef>
#include <cstdint>

#include <torch/arg.h>

namespace tensortap {

/// The file format of a run.
enum class Format {
  /// One `.npy` file per record under `npy/<kind>/<name>/<step>.npy`.
  Npy,
  /// One `tensors.h5` per run: `/<kind>/<name>/data` grows by a row per
  /// record. Needs a build with HDF5 (`TENSORTAP_WITH_HDF5`).
  Hdf5,
  /// `.npy` images appended to a few segment files per rank,
  /// `packed/<8 digits>.npys`, each at a 64-byte-aligned offset: far fewer
  /// files than `Npy` for runs with many small tensors, and still
  /// `f.seek(offset); np.load(f)` to read one. Index lines add `"offset"`
  /// and `"nbytes"` to `"file"`.
  Packed,
};

/// Settings of the HDF5 writer (`Format::Hdf5`).
///
/// Example:
/// ```
/// auto opts = tensortap::Options("runs/exp1")
///                 .format(tensortap::Format::Hdf5)
///                 .hdf5(tensortap::Hdf5Options().deflate(4).shuffle(true));
/// ```
struct Hdf5Options {
  /// gzip (deflate) level, 1 to 9; 0 stores the data uncompressed.
  TORCH_ARG(int, deflate) = 0;
  /// Byte-shuffle before deflate: helps floats compress.
  TORCH_ARG(bool, shuffle) = false;
  /// About how many bytes one HDF5 chunk holds. Small records share a chunk
  /// (up to 256 rows), large ones are split.
  TORCH_ARG(std::size_t, chunk_bytes) = std::size_t{1} << 20;
  /// Flush the file (and with it, make the rows visible to SWMR readers and
  /// safe from a crash) every this many sampled steps.
  TORCH_ARG(std::int64_t, flush_every) = 1;
};

/// Settings of the packed writer (`Format::Packed`).
///
/// Example:
/// ```
/// auto opts = tensortap::Options("runs/exp1")
///                 .format(tensortap::Format::Packed)
///                 .packed(tensortap::PackedOptions().segment_bytes(std::size_t{256} << 20));
/// ```
struct PackedOptions {
  /// A new segment file is started once the current one would grow past
  /// this many bytes (between records: a record never spans two segments,
  /// and one larger than this gets a segment of its own).
  TORCH_ARG(std::size_t, segment_bytes) = std::size_t{1} << 30;
};

}  // namespace tensortap
