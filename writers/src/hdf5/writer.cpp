#include "writers/src/hdf5/writer.h"

#include <fcntl.h>
#include <sys/statvfs.h>

#include <cerrno>

#include <algorithm>
#include <chrono>
#include <mutex>

#include <fmt/format.h>

#include <tensortap/error.h>

#include "writers/src/dtypes.h"
#include "writers/src/json.h"
#include "writers/src/paths.h"

namespace tensortap::detail {
namespace {

// Free space kept beyond what a write needs (see check_space()).
constexpr std::uint64_t kHeadroomBytes = std::uint64_t{4} << 20;

}  // namespace

// One record being written into row `row_` of its series.
class Hdf5Sink final : public RecordSink {
 public:
  Hdf5Sink(Hdf5Writer& w, Hdf5Writer::Series& s, const RecordDesc& meta)
      : w_(w), s_(s), meta_(meta), row_(s.next_row), elem_(element_size(meta.dtype.element)) {
    if (meta.shape.size() != s.rank)
      fail(
          "HDF5: record '{}' (kind {}, step {}) has shape of rank {}, but '{}/data' "
          "in '{}' holds rank {}; a name keeps its rank in an HDF5 run",
          meta.name, kind_name(meta.kind), meta.step, meta.shape.size(), s.group, w.path_, s.rank);
    if (meta.dtype.element != s.element)
      fail("HDF5: record '{}' (kind {}, step {}) is {}, but '{}/data' in '{}' is {}", meta.name, kind_name(meta.kind),
           meta.step, meta.dtype.name, s.group, w.path_, s.dtype);
    std::vector<hsize_t> extent = s.extent;
    extent[0] = std::max<hsize_t>(extent[0], row_ + 1);
    for (std::size_t i = 0; i < s.rank; ++i)
      extent[i + 1] = std::max<hsize_t>(extent[i + 1], static_cast<hsize_t>(meta.shape[i]));
    wrap(w.path_, s.group + "/data", "extend", [&] {
      if (extent != s.extent) s.data.extend(extent.data());
      hsize_t rows = extent[0];
      s.steps.extend(&rows);
      if (s.rank > 0) {
        hsize_t dims[2] = {rows, s.rank};
        s.shapes.extend(dims);
      }
    });
    s.extent = extent;
    s.next_row = row_ + 1;
  }

  void append(const void* data, std::size_t n) override {
    std::lock_guard<std::mutex> lock(hdf5_mutex());
    w_.guarded([&] {
      w_.check_open();
      wrap(w_.path_, s_.group + "/data", "write", [&] { write_range(static_cast<const char*>(data), n / elem_); });
    });
  }

  std::string finish() override {
    std::lock_guard<std::mutex> lock(hdf5_mutex());
    return w_.guarded([&] { return finish_locked(); });
  }

 private:
  std::string finish_locked() {
    w_.check_open();
    if (written_ * elem_ != meta_.nbytes)
      fail("HDF5: record '{}' in '{}' is {} bytes short", meta_.name, w_.path_, meta_.nbytes - written_ * elem_);
    wrap(w_.path_, s_.group + "/steps", "write", [&] {
      H5::DataSpace fs = s_.steps.getSpace();
      const hsize_t one = 1;
      fs.selectHyperslab(H5S_SELECT_SET, &one, &row_);
      s_.steps.write(&meta_.step, H5::PredType::NATIVE_INT64, H5::DataSpace(1, &one), fs);
      if (s_.rank > 0) {
        H5::DataSpace ss = s_.shapes.getSpace();
        const hsize_t start[2] = {row_, 0}, count[2] = {1, s_.rank};
        ss.selectHyperslab(H5S_SELECT_SET, count, start);
        s_.shapes.write(meta_.shape.data(), H5::PredType::NATIVE_INT64, H5::DataSpace(1, &count[1]), ss);
      }
    });
    w_.dirty_ = true;
    if (w_.records_since_flush_++ == 0) w_.first_unflushed_ = std::chrono::steady_clock::now();
    w_.bytes_since_flush_ += meta_.nbytes;
    if (meta_.step != w_.last_step_) {
      w_.last_step_ = meta_.step;
      ++w_.steps_since_flush_;
    }
    std::string loc = "\"file\":\"tensors.h5\",\"dataset\":";
    append_json_string(loc, s_.group + "/data");
    loc += fmt::format(",\"row\":{}", row_);
    return loc;
  }

  // Writes `count` elements that continue the record's C-order element
  // stream at `written_`, as the few rectangular blocks that range covers
  // (at most two per axis), so chunks of a large tensor go straight to the
  // file without being gathered first.
  void write_range(const char* p, std::uint64_t count) {
    const c10::IntArrayRef shape = meta_.shape;
    const std::size_t k = shape.size();
    std::vector<std::uint64_t> stride(k, 1);
    for (std::size_t i = k; i-- > 1;) stride[i - 1] = stride[i] * static_cast<std::uint64_t>(shape[i]);
    std::uint64_t a = written_;
    const std::uint64_t b = written_ + count;
    H5::DataSpace fs = s_.data.getSpace();
    while (a < b) {
      std::vector<hsize_t> start{row_}, block{1};
      std::uint64_t n = 1;
      if (k > 0) {
        std::size_t i = 0;
        while (i + 1 < k && (a % stride[i] != 0 || b - a < stride[i])) ++i;
        for (std::size_t j = 0; j < k; ++j) start.push_back(j <= i ? (a / stride[j]) % shape[j] : 0);
        const std::uint64_t c = std::min<std::uint64_t>(shape[i] - start[i + 1], (b - a) / stride[i]);
        for (std::size_t j = 0; j < k; ++j) block.push_back(j < i ? 1 : (j == i ? c : static_cast<hsize_t>(shape[j])));
        n = c * stride[i];
      }
      fs.selectHyperslab(H5S_SELECT_SET, block.data(), start.data());
      const hsize_t mem = n;
      H5::DataSpace ms(1, &mem);
      s_.data.write(p, s_.data.getDataType(), ms, fs);
      a += n;
      p += n * elem_;
    }
    written_ = b;
  }

  Hdf5Writer& w_;
  Hdf5Writer::Series& s_;
  RecordDesc meta_;
  hsize_t row_;
  std::size_t elem_;
  std::uint64_t written_ = 0;
};

Hdf5Writer::Hdf5Writer(const Dir& dir, const Hdf5Options& options)
    : path_(dir.path_of("tensors.h5")), journal_(std::make_unique<Hdf5Journal>(dir)), options_(options) {
  // The file is created here, exclusively and never through a link, and
  // HDF5 works on this descriptor: the same file, whatever the path names
  // by then.
  fd_ = dir.open_file("tensors.h5", O_RDWR | O_CREAT | O_EXCL);
  std::lock_guard<std::mutex> lock(hdf5_mutex());
  // Failures become exceptions with the file and object named; HDF5's own
  // stack dump on stderr would only repeat them.
  H5::Exception::dontPrint();
  try {
    create_file();
    wrap(path_, "/", "write attributes of", [&] { write_file_attributes(*file_); });
    // The file stays in SWMR mode from here to its close (see create_series()).
    if (H5Fstart_swmr_write(file_->getId()) < 0) fail("HDF5: cannot start SWMR writing of '{}'", path_);
  } catch (...) {
    drop_file();                                 // under the lock: its destructor calls HDF5
    if (file_leaked_) (void)journal_.release();  // HDF5's exit still reaches it
    throw;
  }
}

void Hdf5Writer::drop_file() noexcept {
  for (auto& [key, s] : series_) release(s);
  series_.clear();
  try {
    close_file();
  } catch (...) {
  }
}

void Hdf5Writer::close_file() {
  if (!file_) return;
  try {
    wrap(path_, "/", "close", [&] { file_->close(); });
    unflushed_bytes_ = 0;
  } catch (const Error&) {
    // The H5File's destructor would close the half-closed file again,
    // which crashes inside HDF5 1.10: let the object go undestroyed.
    (void)file_.release();
    file_leaked_ = true;
    journal_->freeze();
    throw;
  }
  file_.reset();
}

bool Hdf5Writer::is_library_failure(const Error& e) noexcept { return dynamic_cast<const Hdf5Failure*>(&e) != nullptr; }

void Hdf5Writer::give_up(const std::string& why) noexcept {
  // After a failure inside the library the file is no longer written: a
  // failed flush leaves HDF5 1.10's metadata cache unable to close the file
  // (and closing it again, as the library does at exit, crashes). That is
  // why check_space() keeps HDF5 from running out of room in the first place.
  if (broken_.empty()) broken_ = why;
  journal_->freeze();  // nothing more reaches the file, not even at exit
}

void Hdf5Writer::check_space(std::uint64_t bytes) const {
  struct statvfs st {};
  if (::fstatvfs(fd_.fd(), &st) != 0) return;  // unknown: let the write say
  const std::uint64_t free = static_cast<std::uint64_t>(st.f_bavail) * st.f_frsize;
  const std::uint64_t need = bytes + unflushed_bytes_ + largest_chunk_ + kHeadroomBytes;
  if (free < need)
    fail(std::error_code(ENOSPC, std::system_category()),
         "HDF5: not writing to '{}': {} bytes free on its file system, {} needed (the record's chunks, {} for "
         "chunks not yet flushed, the largest chunk, {}, and {} of headroom: HDF5 1.10 cannot recover from a full "
         "disk, so tensortap stops short of one) (errno {})",
         path_, free, need, unflushed_bytes_, largest_chunk_, kHeadroomBytes, ENOSPC);
}

void Hdf5Writer::release(Series& s) noexcept {
  // Assigning a DataSet closes the old one, and HDF5's C++ API throws
  // H5::Exception (not a std::exception) if that fails: never let it out.
  for (H5::DataSet* d : {&s.data, &s.steps, &s.shapes}) {
    try {
      *d = H5::DataSet();
    } catch (const H5::Exception&) {
    }
  }
}

Hdf5Writer::~Hdf5Writer() {
  try {
    close();
  } catch (...) {
    // close() already failed once and was reported by the backend.
  }
  if (file_leaked_) (void)journal_.release();  // HDF5's exit still reaches it
}

void Hdf5Writer::create_file() {
  wrap(path_, "/", "create", [&] {
    H5::FileAccPropList fapl = journaled_fapl(fd_, journal_.get());
    // SWMR needs the latest file format.
    fapl.setLibverBounds(H5F_LIBVER_LATEST, H5F_LIBVER_LATEST);
    // The root group's links (the kinds) are dense too: set_dense_links().
    H5::FileCreatPropList fcpl;
    set_dense_links(fcpl.getId());
    file_ = std::make_unique<H5::H5File>(path_, H5F_ACC_TRUNC, fcpl, fapl);
  });
}

std::string Hdf5Writer::key_of(const RecordDesc& meta) const {
  return fmt::format("/{}/{}", kind_name(meta.kind), encode_name(meta.name));
}

void Hdf5Writer::create_series(const std::vector<const RecordDesc*>& records) {
  std::vector<const RecordDesc*> fresh;
  for (const RecordDesc* m : records) {
    const std::string key = key_of(*m);
    if (series_.count(key) == 0 &&
        std::none_of(fresh.begin(), fresh.end(), [&](const RecordDesc* f) { return key_of(*f) == key; }))
      fresh.push_back(m);
  }
  if (fresh.empty()) return;
  check_open();
  // Each new series allocates a first chunk.
  std::uint64_t first_chunks = 0;
  for (const RecordDesc* m : fresh) {
    const std::uint64_t chunk = chunk_bytes(data_chunk(*m, options_), m->dtype.element);
    first_chunks += chunk;
    largest_chunk_ = std::max(largest_chunk_, chunk);
  }
  check_space(first_chunks);
  // The datasets are made without leaving SWMR mode: leaving it means
  // closing the file, and with it every open dataset, which cost a new name
  // time in proportion to the names there were (bench/README.md). HDF5 1.10
  // refuses nothing here, but orders none of these writes for readers the
  // way it orders appends: it links the new objects into groups in place.
  // In SWMR mode the file on disk is whole at any moment (what a crash
  // between two flushes leaves), so the journal keeps, from now until the
  // next flush has written everything (sync(), at the latest at the end of
  // this batch), every byte overwritten below the file's present length: a
  // reader that finds the journal of a dead writer reads the file as it was
  // now. Rows written in the span are indexed only after it ends.
  try {
    if (!journal_->active()) {
      journal_->begin(fd_.size());
      span_began_ = std::chrono::steady_clock::now();
    }
    for (const RecordDesc* m : fresh) {
      const std::string key = key_of(*m);
      creation_errors_.erase(key);
      Series s;
      s.group = key;
      s.element = m->dtype.element;
      s.dtype = m->dtype.name;
      s.rank = m->shape.size();
      s.extent.assign(s.rank + 1, 0);
      try {
        wrap(path_, key, "create", [&] { create_series_group(*file_, *m, options_, s); });
        series_.emplace(key, std::move(s));
      } catch (const Error& e) {
        // This name fails alone: its records' begin() report why, the others
        // go on. A half-made group would make the next attempt fail anew.
        creation_errors_[key] = e.what();
        release(s);
        try {
          if (file_->nameExists(key)) file_->unlink(key);
        } catch (const H5::Exception&) {
        }
      }
    }
  } catch (const Error& e) {
    // The journal could not be begun or saved to: nothing more is written
    // (rows indexed later would be rolled back with it), and what journal
    // there is stays for readers.
    give_up(e.what());
    throw;
  }
}

void Hdf5Writer::end_span() {
  try {
    journal_->end();
  } catch (const Error& e) {
    // A journal left behind would roll the rows flushed since back for a
    // reader once the writer is gone: nothing more is indexed.
    give_up(e.what());
    throw;
  }
  last_span_ = std::chrono::steady_clock::now() - span_began_;
}

void Hdf5Writer::prepare(const std::vector<const RecordDesc*>& records) {
  std::lock_guard<std::mutex> lock(hdf5_mutex());
  H5::Exception::dontPrint();
  guarded([&] { create_series(records); });
}

Hdf5Writer::Series& Hdf5Writer::series_of(const RecordDesc& meta) {
  const std::string key = key_of(meta);
  auto it = series_.find(key);
  if (it == series_.end()) {
    create_series({&meta});
    it = series_.find(key);
  }
  if (it == series_.end())
    fail("HDF5: no dataset for record '{}' (kind {}, step {}) in '{}': {}", meta.name, kind_name(meta.kind), meta.step,
         path_, creation_errors_[key]);
  return it->second;
}

std::unique_ptr<RecordSink> Hdf5Writer::begin(const RecordDesc& meta) {
  std::lock_guard<std::mutex> lock(hdf5_mutex());
  return guarded([&] {
    check_open();
    Series& s = series_of(meta);
    const std::uint64_t grows = new_chunk_bytes(s, meta.shape, s.next_row);
    check_space(std::max<std::uint64_t>(grows, meta.nbytes));
    auto sink = std::make_unique<Hdf5Sink>(*this, s, meta);
    unflushed_bytes_ += grows;  // counted once the row is taken
    return std::unique_ptr<RecordSink>(std::move(sink));
  });
}

bool Hdf5Writer::flush_due() const {
  if (options_.flush_every() > 0) return steps_since_flush_ >= options_.flush_every();
  // Sized from the records, and bounded in time: a reader waits for rows
  // (and their index lines) a second at most, when steps keep coming.
  const std::uint64_t mean =
      bytes_since_flush_ / static_cast<std::uint64_t>(std::max<std::int64_t>(records_since_flush_, 1));
  return steps_since_flush_ >= auto_flush_steps(mean) ||
         std::chrono::steady_clock::now() - first_unflushed_ >= std::chrono::seconds(1);
}

bool Hdf5Writer::sync(bool force) {
  std::lock_guard<std::mutex> lock(hdf5_mutex());
  const bool span = journal_->active();
  if (!dirty_ && !span) return true;
  check_open();
  // New names' span ends at the end of their batch: readers wait for it.
  if (!force && !span && !flush_due()) return false;
  // In SWMR mode a flush is what makes the new rows visible to readers.
  guarded([&] {
    wrap(path_, "/", "flush", [&] { file_->flush(H5F_SCOPE_GLOBAL); });
    if (span) end_span();
  });
  unflushed_bytes_ = 0;
  dirty_ = false;
  steps_since_flush_ = 0;
  records_since_flush_ = 0;
  bytes_since_flush_ = 0;
  // More records of the same step may come in later batches: they count as
  // a step of their own, so the next sync flushes them too.
  last_step_ = -1;
  return true;
}

void Hdf5Writer::close() {
  std::lock_guard<std::mutex> lock(hdf5_mutex());
  if (!file_) {
    fd_ = File();
    return;
  }
  if (!broken_.empty()) {
    // After a failure, closing would fail inside HDF5 and leave it to
    // crash at exit (see give_up()): the file is let go unclosed. Rows
    // flushed before the failure are readable; later ones may not be.
    for (auto& [key, s] : series_) release(s);
    series_.clear();
    (void)file_.release();
    file_leaked_ = true;
    fd_ = File();
    fail("HDF5: '{}' was left unclosed after an earlier failure: {}", path_, broken_);
  }
  // Every HDF5 object dies here, under the lock: their destructors call the
  // library too.
  for (auto& [key, s] : series_) release(s);
  series_.clear();
  try {
    close_file();
    // Closed, the file is whole: new names made since the last flush no
    // longer need their journal.
    if (journal_->active()) end_span();
  } catch (...) {
    fd_ = File();
    throw;
  }
  fd_ = File();
}

}  // namespace tensortap::detail
