#include "writers/src/stats_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include <fmt/format.h>

#include "writers/src/file.h"
#include "writers/src/json.h"
#include "writers/src/npy_format.h"

namespace tensortap::detail {
namespace {

// One row of stats.npy, in field order. Every field is 8 bytes, so the
// struct has no padding and its bytes are the row's.
struct Row {
  std::int64_t step, series;
  double min, max, mean, std, norm;
  std::int64_t nan, posinf, neginf, zeros, numel;
};
static_assert(sizeof(Row) == 12 * 8, "a stats row is twelve 8-byte fields");

// The header is rewritten in place as rows are added, so its size must not
// depend on the row count: room for any int64 count, rounded up to keep the
// data 64-byte aligned like every .npy tensortap writes.
constexpr std::size_t kHeaderBytes = 512;

std::string header(std::int64_t rows) {
  const std::string i8 = npy_descr(c10::kLong), f8 = npy_descr(c10::kDouble);
  std::string descr = "[";
  const char* ints[] = {"step", "series"};
  const char* floats[] = {"min", "max", "mean", "std", "norm"};
  const char* counts[] = {"nan", "posinf", "neginf", "zeros", "numel"};
  for (const char* f : ints) descr += fmt::format("('{}', '{}'), ", f, i8);
  for (const char* f : floats) descr += fmt::format("('{}', '{}'), ", f, f8);
  for (const char* f : counts) descr += fmt::format("('{}', '{}'), ", f, i8);
  descr.resize(descr.size() - 2);
  descr += "]";
  std::string dict = fmt::format("{{'descr': {}, 'fortran_order': False, 'shape': ({},), }}", descr, rows);
  std::string h("\x93NUMPY\x01\x00", 8);
  const std::size_t len = kHeaderBytes - 10;
  h.push_back(static_cast<char>(len & 0xFF));
  h.push_back(static_cast<char>(len >> 8));
  dict.append(len - dict.size() - 1, ' ');
  dict.push_back('\n');
  return h + dict;
}

void write_all(int fd, const char* data, std::size_t n, off_t at, const std::string& path) {
  while (n > 0) {
    const ssize_t w = at >= 0 ? ::pwrite(fd, data, n, at) : ::write(fd, data, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      throw_errno("write", path, errno);
    }
    data += w;
    n -= static_cast<std::size_t>(w);
    if (at >= 0) at += w;
  }
}

}  // namespace

StatsFile::~StatsFile() {
  if (fd_ >= 0) ::close(fd_);
}

void StatsFile::open() {
  const std::string path = dir_ + "/stats.npy";
  fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd_ < 0) throw_errno("create", path, errno);
  const std::string h = header(0);
  write_all(fd_, h.data(), h.size(), 0, path);
  ::lseek(fd_, 0, SEEK_END);
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
  const Row row{step, it->second, s.min, s.max, s.mean, s.std, s.norm, s.nan, s.posinf, s.neginf, s.zeros, s.numel};
  pending_.append(reinterpret_cast<const char*>(&row), sizeof row);
  ++pending_rows_;
}

void StatsFile::flush(bool durable) {
  if (pending_rows_ == 0 && !durable) return;
  if (fd_ < 0) {
    if (pending_rows_ == 0) return;
    open();
  }
  const std::string path = dir_ + "/stats.npy";
  // The series a row names is on disk before the header counts the row.
  if (!pending_series_.empty()) {
    const std::string legend = dir_ + "/stats_series.jsonl";
    const int fd = ::open(legend.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (fd < 0) throw_errno("create", legend, errno);
    try {
      write_all(fd, pending_series_.data(), pending_series_.size(), -1, legend);
      if (durable && ::fdatasync(fd) != 0) throw_errno("fsync", legend, errno);
    } catch (...) {
      ::close(fd);
      throw;
    }
    ::close(fd);
    pending_series_.clear();
  }
  if (pending_rows_ > 0) {
    const std::int64_t rows = pending_rows_;
    pending_rows_ = 0;
    const std::string bytes = std::move(pending_);
    pending_.clear();
    try {
      write_all(fd_, bytes.data(), bytes.size(), -1, path);
    } catch (...) {
      // A short write (disk full) must not shift the rows that come later:
      // cut the file back to its whole rows. These rows are lost, and the
      // caller counts the error.
      const off_t whole = static_cast<off_t>(kHeaderBytes + rows_ * sizeof(Row));
      if (::ftruncate(fd_, whole) == 0) ::lseek(fd_, whole, SEEK_SET);
      throw;
    }
    rows_ += rows;
    const std::string h = header(rows_);
    write_all(fd_, h.data(), h.size(), 0, path);
  }
  if (durable && ::fdatasync(fd_) != 0) throw_errno("fsync", path, errno);
}

}  // namespace tensortap::detail
