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
  /// (up to 256 rows), large ones are split. 0 (the default): sized from each
  /// name's first record, so that a flush rewrites little more than the rows
  /// it adds: rows of up to 64 KiB share a chunk of about 64 KiB, larger rows
  /// get a chunk each, split into chunks of about 1 MiB above that.
  TORCH_ARG(std::size_t, chunk_bytes) = 0;
  /// Flush the file (and with it, make the rows visible to SWMR readers and
  /// safe from a crash, and index them) every this many sampled steps.
  /// 0 (the default): sized from the records: after every sampled step for
  /// records of 64 KiB and more on average, up to every 8 sampled steps for
  /// smaller ones, and at the first step that ends a second or more after
  /// the oldest row not yet flushed. `Recorder::flush()` always flushes.
  TORCH_ARG(std::int64_t, flush_every) = 0;
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
