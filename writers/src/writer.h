#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include <c10/util/SmallVector.h>

#include <tensortap/format.h>
#include <tensortap/kinds.h>

#include "writers/src/dtypes.h"

namespace tensortap::detail {

class Dir;

/// A record as the writers see it: what it is and the shape of its bytes.
/// What the pipeline does with it (store, hold, statistics) is sdk's
/// (sdk/src/core/record.h); a writer only ever stores.
struct RecordDesc {
  Kind kind = Kind::Tensor;
  /// The record's name, with its `#k` repeat suffix.
  std::string name;
  std::int64_t step = 0;
  /// The dtype as captured (its name: bfloat16 stays bfloat16 here) and
  /// what its bytes hold (bfloat16 arrives as float32). A description, not
  /// a LibTorch dtype, so records of dtypes the LibTorch at hand lacks
  /// (uint16, float8 on 1.13) can be written in tests.
  DtypeInfo dtype;
  /// Inline up to 8 dimensions: a record's metadata is built on the
  /// training thread for every capture, and a heap-allocated shape was a
  /// malloc there and a free on the writer thread each time.
  c10::SmallVector<std::int64_t, 8> shape;
  /// Bytes of data, C order.
  std::uint64_t nbytes = 0;
};

/// One record being written. Its bytes arrive in order, in one or more
/// `append()` calls (a tensor larger than a staging buffer comes in chunks).
/// Destroying a sink before `finish()` discards the record and leaves no
/// file under a final name.
class RecordSink {
 public:
  virtual ~RecordSink() = default;
  virtual void append(const void* data, std::size_t n) = 0;
  /// Makes the record durable under its final name and returns the JSON
  /// members that locate it in index.jsonl, e.g. `"file":"npy/..."`.
  virtual std::string finish() = 0;
};

/// A run's storage. Used from the writer thread only.
class Writer {
 public:
  virtual ~Writer() = default;
  /// Announces the records of a batch before their `begin()`, so a format
  /// can create what they need at once. Must not throw for one bad record:
  /// its `begin()` reports it.
  virtual void prepare(const std::vector<const RecordDesc*>& records) { (void)records; }
  virtual std::unique_ptr<RecordSink> begin(const RecordDesc& meta) = 0;
  /// Called after each batch, and with `force` by `Recorder::flush()`.
  /// Returns whether every record finished so far is durable (a crash cannot
  /// lose it): only then may their index lines be written. With `force` it
  /// must make them durable.
  virtual bool sync(bool force) {
    (void)force;
    return true;
  }
  /// Finalizes what the format needs at the end of a run; all is durable after.
  virtual void close() = 0;
  /// After `sync()` or `close()` threw (a full disk): makes durable what is
  /// already in the files and returns how many of the records finished since
  /// the last `sync()` that returned true, oldest first, are durable despite
  /// the failure, so that their index lines may still be written. Called
  /// once per failure; 0 (the default) leaves them all unindexed.
  virtual std::size_t durable_after_failure() noexcept { return 0; }
  /// The bytes the format keeps below the run directory's top (npy/,
  /// packed/: the files' apparent sizes, and the subdirectories' as they
  /// were made), for a disk budget that must not walk them; 0 for a format
  /// whose files sit at the top (HDF5's tensors.h5), which the budget
  /// measures itself.
  virtual std::uint64_t disk_bytes() const { return 0; }

  // A disk budget that gives up the oldest steps (Budget::KeepLatest).
  // Npy and Packed do; HDF5 cannot give a record's rows up in place (the
  // options refuse it), so its writer keeps the defaults: nothing to give.

  /// Turns it on, for a budget of `max_bytes`, before the first record: the
  /// writer remembers what each step's records take on disk, so that giving
  /// steps up deletes their files without a walk over the run.
  virtual void keep_latest(std::uint64_t max_bytes) { (void)max_bytes; }
  /// KeepLatest: the next record begins a new file where records share one
  /// (packed's segments), so that a dump's steps, which a budget keeps
  /// longer, do not hold other steps' records with them.
  virtual void cut() {}
  /// KeepLatest: the bytes on disk that keeping `step` holds back from a
  /// give-up (its files; packed: every segment whose steps span it), so
  /// that a step kept after some of its records were written (a dump's
  /// trigger step, inside a capture window) counts them in the dumps' share.
  virtual std::uint64_t bytes_held_by(std::int64_t step) const {
    (void)step;
    return 0;
  }
  /// What giving up the steps below a step would free: the smallest `below`
  /// (at most `limit`) whose records, those of the steps in `kept` aside,
  /// take `want` bytes or more, and those bytes; `limit` and all it could
  /// free when that is less than `want`. `below` is never under `from`, the
  /// steps given up so far.
  struct GiveUp {
    std::int64_t below = 0;
    std::uint64_t bytes = 0;
  };
  virtual GiveUp plan_give_up(std::uint64_t want, std::int64_t from, std::int64_t limit,
                              const std::set<std::int64_t>& kept) const {
    (void)want;
    (void)limit;
    (void)kept;
    return GiveUp{from, 0};
  }
  /// Deletes the files that only records of steps below `below` (those in
  /// `kept` aside) are in; returns the bytes they took. Throws on an error
  /// (what was deleted stays deleted: the run already says it was given up).
  virtual std::uint64_t give_up(std::int64_t below, const std::set<std::int64_t>& kept) {
    (void)below;
    (void)kept;
    return 0;
  }
};

/// The writer of `format` (with `hdf5`'s settings for `Format::Hdf5`,
/// `packed`'s for `Format::Packed`), writing under `dir` (which must outlive it).
std::unique_ptr<Writer> make_writer(Format format, const Hdf5Options& hdf5, const PackedOptions& packed,
                                    const Dir& dir);

}  // namespace tensortap::detail
