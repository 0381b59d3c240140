#pragma once

#include <chrono>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <H5Cpp.h>

#include <tensortap/format.h>

#include "writers/src/check.h"
#include "writers/src/file.h"
#include "writers/src/hdf5/journal.h"
#include "writers/src/hdf5/layout.h"
#include "writers/src/writer.h"

namespace tensortap::detail {

/// Writes every record into one `tensors.h5` in SWMR mode.
///
/// Layout (docs/design.md#hdf5): a group `/<kind>/<encoded name>` per series,
/// holding `data` [n, *shape] (every axis unlimited, chunked), `steps` [n]
/// int64 (-1 in a row not yet finished) and, for tensors of rank >= 1,
/// `shapes` [n, rank] int64. A record whose shape differs from earlier ones
/// (a smaller last batch) is written into the top-left corner of its row,
/// the axes grow to the largest shape seen, and `shapes` (and the index
/// line's "shape") says which part of the row is the record; the rest is 0.
/// Group attributes: `name`, `kind`, `dtype` (LibTorch's name, e.g.
/// "bfloat16"), `shape` (the first record's). File attributes:
/// `tensortap_version`, `torch_version`, `format_version`.
///
/// The file is in SWMR mode from its creation to its close. HDF5 1.10 orders
/// only appends for SWMR readers, so the groups of new names (made once per
/// batch that brings any: in practice, the first sampled step) are made
/// between two flushes under a rollback journal (Hdf5Journal): a crash in
/// that span loses nothing indexed before, and the reader waits for a live
/// writer to end it. Chunks and the flush cadence are sized from the records
/// (layout.h) unless Hdf5Options fixes them.
class Hdf5Writer final : public Writer {
 public:
  /// Creates `tensors.h5` in `dir`.
  Hdf5Writer(const Dir& dir, const Hdf5Options& options);
  ~Hdf5Writer() override;

  void prepare(const std::vector<const RecordDesc*>& records) override;
  std::unique_ptr<RecordSink> begin(const RecordDesc& meta) override;
  bool sync(bool force) override;
  void close() override;
  /// How long the journal of the last new names was kept, from their
  /// creation to the flush that ended it: the span a crash is rolled back
  /// over, and a reader waits for (for the benchmark).
  std::chrono::steady_clock::duration last_span() const { return last_span_; }

  using Series = Hdf5Series;

 private:
  friend class Hdf5Sink;
  void create_file();
  void create_series(const std::vector<const RecordDesc*>& records);
  // Whether the rows written since the last flush are due to be flushed.
  bool flush_due() const;
  // After a flush: the journal of new names is no longer needed.
  void end_span();
  // Throws if an earlier failure closed the file.
  void check_open() const {
    if (!file_ || !broken_.empty())
      fail("HDF5: '{}' is no longer written after an earlier failure: {}", path_, broken_);
  }
  // Runs `f`; after a failure of the HDF5 library in it the file is no
  // longer written (see give_up()); the failure is rethrown.
  template <class F>
  auto guarded(F&& f) -> decltype(f()) {
    try {
      return f();
    } catch (const Error& e) {
      if (is_library_failure(e)) give_up(e.what());
      throw;
    }
  }
  static bool is_library_failure(const Error& e) noexcept;
  void give_up(const std::string& why) noexcept;
  // Throws Error (code ENOSPC) when the file system has too little room left
  // to write `bytes` without risking a full disk inside HDF5.
  void check_space(std::uint64_t bytes) const;
  // Closes the file once; a failed close is never retried (see give_up()).
  void close_file();
  static void release(Series& s) noexcept;
  void drop_file() noexcept;
  Series& series_of(const RecordDesc& meta);
  std::string key_of(const RecordDesc& meta) const;

  // The path, for messages.
  std::string path_;
  // The file, created by the constructor; HDF5 reads and writes it through
  // this descriptor (journaled_fapl()), never by its path.
  File fd_;
  // On the heap: a file left unclosed after a failure is closed by HDF5 at
  // exit through the driver, which still reads it (leaked then, frozen).
  std::unique_ptr<Hdf5Journal> journal_;
  bool file_leaked_ = false;
  // Why the file was closed early, once it was.
  std::string broken_;
  Hdf5Options options_;
  std::unique_ptr<H5::H5File> file_;
  std::map<std::string, Series> series_;
  // Why a series could not be created, for its records' begin() to say.
  std::map<std::string, std::string> creation_errors_;
  std::int64_t last_step_ = -1;
  std::int64_t steps_since_flush_ = 0;
  // Records and their bytes since the last flush, and when the first came:
  // the automatic cadence (Hdf5Options::flush_every 0) is sized from them.
  std::int64_t records_since_flush_ = 0;
  std::uint64_t bytes_since_flush_ = 0;
  std::chrono::steady_clock::time_point first_unflushed_{};
  // The largest chunk of any series: what a flush may newly allocate at most
  // per series beyond the counted rows (check_space()).
  std::uint64_t largest_chunk_ = 0;
  // File space that records accepted since the last flush may still take:
  // HDF5 allocates a chunk when its cache writes it, so free space on disk
  // does not show it yet (check_space() counts it).
  std::uint64_t unflushed_bytes_ = 0;
  bool dirty_ = false;
  std::chrono::steady_clock::time_point span_began_{};
  std::chrono::steady_clock::duration last_span_{};
};

}  // namespace tensortap::detail
