#include "writers/src/stats_file.h"

#include <fcntl.h>

#include <algorithm>
#include <exception>

#include <fmt/format.h>

#include "writers/src/check.h"
#include "writers/src/file.h"
#include "writers/src/json.h"
#include "writers/src/npy/format.h"
#include "writers/src/lines_file.h"
#include "writers/src/run_dir.h"

namespace tensortap::detail {
namespace {

// One row of stats.npy, in field order. Every field is 8 bytes, so the
// struct has no padding and its bytes are the row's.
struct Row {
  std::int64_t step, series;
  TensorStats stats;
};
static_assert(sizeof(Row) == (2 + kStatsFields) * 8, "a stats row is 8-byte fields without padding");

// The header is rewritten in place as rows are added, so its size must not
// depend on the row count: room for any int64 count, rounded up to keep the
// data 64-byte aligned like every .npy tensortap writes.
constexpr std::size_t kHeaderBytes = 512;

std::string header(std::int64_t rows) {
  // Leaked, never destroyed: close() of a recorder held in a static runs at
  // exit, possibly after this table's destructor would have run.
  static const std::vector<NpyField>* const fields = new std::vector<NpyField>([] {
    const std::string i8 = npy_descr(Element::I64), f8 = npy_descr(Element::F64);
    std::vector<NpyField> f{{"step", i8}, {"series", i8}};
#define TENSORTAP_REAL_(name) f.push_back({#name, f8});
#define TENSORTAP_COUNT_(name) f.push_back({#name, i8});
    TENSORTAP_STATS_FIELDS(TENSORTAP_REAL_, TENSORTAP_COUNT_)
#undef TENSORTAP_REAL_
#undef TENSORTAP_COUNT_
    return f;
  }());
  std::string h = npy_header(*fields, {rows}, kHeaderBytes);
  // A longer header would move the rows already written.
  TENSORTAP_CHECK(h.size() == kHeaderBytes, "stats.npy's header takes {} bytes, not {}", h.size(), kHeaderBytes);
  return h;
}

}  // namespace

StatsFile::StatsFile(const Dir& dir) : dir_(dir) {}

StatsFile::~StatsFile() = default;

void StatsFile::close() noexcept {
  file_ = File();
  series_file_.reset();
}

void StatsFile::open() {
  file_ = dir_.open_file(numbered_name("stats", "npy", segment_), O_RDWR | O_CREAT | O_EXCL);
  const std::string h = header(0);
  file_.write_all(h.data(), h.size());
}

void StatsFile::append(Kind kind, const std::string& name, std::int64_t step, const TensorStats& s) {
  std::string key(1, static_cast<char>(kind));
  key += name;
  auto it = series_.find(key);
  if (it == series_.end()) {
    it = series_.emplace(std::move(key), static_cast<std::int64_t>(series_.size())).first;
    pending_series_ += fmt::format("{{\"series\":{},\"kind\":\"{}\",\"name\":", it->second, kind_name(kind));
    append_json_string(pending_series_, name);
    pending_series_ += "}\n";
  }
  // KeepLatest: a full segment ends before a newer step's first row, so
  // that each holds whole steps (a late row of an older step joins the
  // segment being written).
  if (segment_bytes_ > 0 && segment_rows_ > 0 && step > max_step_ &&
      kHeaderBytes + static_cast<std::uint64_t>(segment_rows_) * sizeof(Row) >= segment_bytes_) {
    ended_.push_back(Ended{std::move(pending_), pending_rows_, min_step_, max_step_});
    pending_.clear();
    pending_rows_ = 0;
    segment_rows_ = 0;
  }
  if (segment_rows_++ == 0) min_step_ = max_step_ = step;
  min_step_ = std::min(min_step_, step);
  max_step_ = std::max(max_step_, step);
  const Row row{step, it->second, s};
  pending_.append(reinterpret_cast<const char*>(&row), sizeof row);
  ++pending_rows_;
}

void StatsFile::write_rows(const std::string& bytes, std::int64_t rows) {
  if (rows == 0) return;
  if (!file_) open();
  const std::uint64_t whole = kHeaderBytes + static_cast<std::uint64_t>(rows_) * sizeof(Row);
  try {
    file_.pwrite_all(bytes.data(), bytes.size(), whole);
  } catch (...) {
    // A short write (disk full) must not leave part of a row that later
    // rows would be shifted by: cut the file back to its whole rows.
    // These rows are lost, and the caller counts the error.
    try {
      file_.truncate(whole);
    } catch (...) {
    }
    throw;
  }
  rows_ += rows;
  const std::string h = header(rows_);
  file_.pwrite_all(h.data(), h.size(), 0);
}

void StatsFile::end_segment(std::int64_t min_step, std::int64_t max_step) {
  if (file_) {
    segments_.add(StepFiles::Entry{numbered_name("stats", "npy", segment_), min_step, max_step,
                                   kHeaderBytes + static_cast<std::uint64_t>(rows_) * sizeof(Row), rows_});
    file_ = File();
  }
  rows_ = 0;
  ++segment_;
}

std::uint64_t StatsFile::bytes_below(std::int64_t below) const {
  // Segments ended since the last flush count too: give_up() writes them first.
  std::uint64_t bytes = segments_.bytes_below(below);
  std::int64_t rows = rows_;
  for (const Ended& e : ended_) {
    if (e.max_step < below) bytes += kHeaderBytes + static_cast<std::uint64_t>(rows + e.rows) * sizeof(Row);
    rows = 0;
  }
  return bytes;
}

std::uint64_t StatsFile::give_up(std::int64_t below) {
  // A batch of many steps ends segments before its flush: they are written
  // (and listed) first, so that their steps can go.
  std::exception_ptr first;
  try {
    write_ended();
  } catch (...) {
    first = std::current_exception();
  }
  const std::uint64_t freed = segments_.give_up(dir_, below);
  if (first) std::rethrow_exception(first);
  return freed;
}

void StatsFile::write_ended() {
  if (!pending_series_.empty() && !ended_.empty()) {
    // The series a row names is on disk before the header counts the row.
    if (!series_file_) series_file_ = std::make_unique<LinesFile>(dir_, "stats_series.jsonl");
    series_file_->append(pending_series_);
    pending_series_.clear();
  }
  // A failed segment loses its rows (counted by the caller) and the next
  // still begins.
  std::exception_ptr first;
  std::vector<Ended> ended;
  ended.swap(ended_);
  for (const Ended& e : ended) {
    try {
      write_rows(e.bytes, e.rows);
    } catch (...) {
      if (!first) first = std::current_exception();
    }
    end_segment(e.min_step, e.max_step);
  }
  if (first) std::rethrow_exception(first);
}

void StatsFile::flush(bool durable) {
  if (pending_rows_ == 0 && ended_.empty() && (!durable || !file_)) return;
  // The series a row names is on disk before the header counts the row.
  if (!pending_series_.empty()) {
    if (!series_file_) series_file_ = std::make_unique<LinesFile>(dir_, "stats_series.jsonl");
    series_file_->append(pending_series_);
    pending_series_.clear();
  }
  if (series_file_ && durable) series_file_->datasync();
  // Segments that ended since the last flush: their last rows, then the next.
  std::exception_ptr first;
  try {
    write_ended();
  } catch (...) {
    first = std::current_exception();
  }
  const std::int64_t rows = pending_rows_;
  pending_rows_ = 0;
  const std::string bytes = std::move(pending_);
  pending_.clear();
  try {
    write_rows(bytes, rows);
    if (durable && file_) file_.datasync();
  } catch (...) {
    if (!first) first = std::current_exception();
  }
  if (first) std::rethrow_exception(first);
}

}  // namespace tensortap::detail
