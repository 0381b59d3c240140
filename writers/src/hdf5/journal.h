#pragma once

#include <cstdint>
#include <map>
#include <string>

#include <H5Cpp.h>

#include "writers/src/file.h"

namespace tensortap::detail {

/// A rollback journal for `tensors.h5`, kept while the writer makes the
/// datasets of new names.
///
/// In SWMR mode HDF5 orders its writes so that the file on disk is readable
/// at every moment, but only those of appends to existing datasets. Making a
/// dataset (which HDF5 1.10 does not order for readers) overwrites metadata
/// in place, in no useful order: a writer killed then could leave a group
/// index pointing at blocks never written, and the names indexed long before
/// would be lost with the new one. So from the moment the writer starts
/// making datasets (the file on disk whole, `limit` bytes long) until a flush
/// has written all of it, this journal keeps every byte below `limit` that is
/// overwritten, saved before the overwrite. Then the journal is emptied and
/// removed. A reader that finds a journal whose writer is dead reads the file
/// as it was at `limit` (python/tensortap/_hdf5.py); while the writer lives,
/// it waits for the journal to go.
///
/// The file, little endian: "TTHDF5J1", uint64 limit, then records
/// {uint64 offset, uint64 length, bytes}, each written before the overwrite
/// it saves. A record cut short by a crash is ignored: its overwrite never
/// happened. It protects against the process dying (SIGKILL, abort), not
/// against power loss (nothing is fsynced).
class Hdf5Journal {
 public:
  static constexpr const char* kName = ".tensors.h5.journal";
  static constexpr char kMagic[9] = "TTHDF5J1";

  explicit Hdf5Journal(const Dir& dir) : dir_(dir) {}
  // Destroyed before end(), it stays on disk: the file may be torn, and the
  // journal is what lets a reader read it as it was.
  Hdf5Journal(const Hdf5Journal&) = delete;
  Hdf5Journal& operator=(const Hdf5Journal&) = delete;

  /// Starts keeping the bytes below `limit` (never through a link: a planted
  /// one is replaced).
  void begin(std::uint64_t limit);
  bool active() const { return static_cast<bool>(file_); }
  /// Saves what `data` holds in [offset, offset + n) below the limit and
  /// not saved before, before the caller overwrites or truncates it.
  void save(const File& data, std::uint64_t offset, std::uint64_t n);
  /// The span is over: empties the journal (a reader then ignores it, should
  /// the removal fail) and removes it.
  void end();
  /// The writer gave the file up: from now on the driver writes nothing to
  /// it, not even when HDF5 closes it at exit, so the file stays as the
  /// journal (if any) and the last flush left it.
  void freeze() noexcept { frozen_ = true; }
  bool frozen() const noexcept { return frozen_; }

 private:
  const Dir& dir_;
  File file_;
  std::uint64_t limit_ = 0;
  // Bytes of whole records: a record that failed part way is cut off.
  std::uint64_t length_ = 0;
  bool frozen_ = false;
  // Ranges saved: start -> end.
  std::map<std::uint64_t, std::uint64_t> saved_;
};

/// File access properties that make HDF5 write `file` (an open `tensors.h5`,
/// through a descriptor of its own)
/// through a POSIX driver that lets `journal` save what each write and
/// truncation would overwrite. Files it writes are ordinary HDF5 files (no
/// driver information is stored): h5py opens them with its default driver.
/// `journal` must outlive the file, even one left unclosed (HDF5 closes it
/// at exit). The writer does not lock the file: the run directory's lock
/// keeps other writers out, and a lock here would let any reader that has
/// the file open (h5py keeps a shared lock) stop the writer from creating
/// new names.
H5::FileAccPropList journaled_fapl(const File& file, Hdf5Journal* journal);

}  // namespace tensortap::detail
