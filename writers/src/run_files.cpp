#include "writers/src/run_files.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <ctime>
#include <filesystem>

#include <fmt/format.h>

#include "writers/src/dtypes.h"
#include "writers/src/file.h"
#include "writers/src/json.h"
#include "writers/src/versions.h"

namespace tensortap::detail {
namespace {

const char* format_name(Format f) { return f == Format::Npy ? "npy" : "hdf5"; }
const char* overflow_name(Overflow o) { return o == Overflow::Block ? "block" : "drop_newest"; }
const char* after_dump_name(AfterDump a) {
  return a == AfterDump::Continue ? "continue" : a == AfterDump::Throw ? "throw" : "stop_capture";
}

// run.json's size on disk (see write_run_json).
constexpr std::size_t kRunJsonBytes = 8192;

bool overwrite_in_place(const std::string& path, const std::string& content) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CLOEXEC);
  if (fd < 0) return false;
  struct stat st {};
  bool ok = ::fstat(fd, &st) == 0 && static_cast<std::size_t>(st.st_size) == content.size() &&
            ::pwrite(fd, content.data(), content.size(), 0) == static_cast<ssize_t>(content.size());
  ok = (::close(fd) == 0) && ok;
  return ok;
}

bool exists(const std::string& path) {
  struct stat st {};
  return ::lstat(path.c_str(), &st) == 0;
}

}  // namespace

std::string utc_now() {
  const auto now = std::chrono::system_clock::now();
  const std::time_t secs = std::chrono::system_clock::to_time_t(now);
  const auto ms =
      std::chrono::duration_cast<std::chrono::milliseconds>(now.time_since_epoch()).count() % 1000;
  std::tm tm {};
  ::gmtime_r(&secs, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%S", &tm);
  return fmt::format("{}.{:03d}Z", buf, ms);
}

void prepare_run_dir(const std::string& dir, const Options& options) {
  if (dir.empty()) throw Error("tensortap: Options: the run directory is empty");
  make_dirs(dir);
  if (exists(dir + "/run.json") || exists(dir + "/index.jsonl")) {
    if (!options.overwrite())
      throw Error(fmt::format("tensortap: '{}' already holds a run (run.json); choose another "
                              "directory or set Options::overwrite(true)",
                              dir));
    // Only what tensortap writes goes: a user's other files stay.
    for (const char* name : {"run.json", "index.jsonl", "npy", "tensors.h5"}) {
      std::error_code ec;
      std::filesystem::remove_all(std::filesystem::path(dir) / name, ec);
      if (ec)
        throw Error(fmt::format("tensortap: cannot remove '{}/{}' to overwrite the run: {}", dir,
                                name, ec.message()));
    }
  }
  if (::access(dir.c_str(), W_OK | X_OK) != 0) throw_errno("write into", dir, errno);
}

void write_run_json(const Options& o, const RunInfo& info) {
  std::string j = "{\n";
  j += fmt::format("  \"format_version\": {},\n", kFormatVersion);
  j += fmt::format("  \"tensortap_version\": \"{}\",\n", kTensortapVersion);
  j += fmt::format("  \"torch_version\": \"{}\",\n", kTorchVersion);
  j += "  \"options\": {\n    \"dir\": ";
  append_json_string(j, o.dir());
  j += fmt::format(",\n    \"format\": \"{}\",\n    \"every\": {},\n    \"start\": {},\n    \"stop\": {},\n",
                   format_name(o.format()), o.every(), o.start(), o.stop());
  j += "    \"include\": ";
  append_json_string(j, o.include());
  j += ",\n    \"exclude\": ";
  append_json_string(j, o.exclude());
  j += ",\n    \"kinds\": [";
  bool first = true;
  for (Kind k : {Kind::Activation, Kind::ActivationGrad, Kind::Param, Kind::Grad, Kind::Tensor}) {
    if (!o.kinds().contains(k)) continue;
    j += fmt::format("{}\"{}\"", first ? "" : ", ", kind_name(k));
    first = false;
  }
  j += "],\n    \"every_by_kind\": {";
  first = true;
  for (Kind k : {Kind::Activation, Kind::ActivationGrad, Kind::Param, Kind::Grad, Kind::Tensor}) {
    j += fmt::format("{}\"{}\": {}", first ? "" : ", ", kind_name(k), o.every(k));
    first = false;
  }
  j += "},\n    \"steps\": ";
  append_json_ints(j, o.steps());
  j += ",\n    \"ranks\": ";
  append_json_ints(j, o.ranks());
  j += fmt::format(",\n    \"capture_eval\": {},\n    \"grad_per_backward\": {},\n    \"capture_ops\": {}",
                   o.capture_eval() ? "true" : "false", o.grad_per_backward() ? "true" : "false",
                   o.capture_ops() ? "true" : "false");
  j += fmt::format(",\n    \"on_error\": \"{}\"", o.on_error() == OnError::Stop ? "stop" : "continue");
  j += ",\n    \"tap_sequential\": ";
  append_json_string(j, o.tap_sequential());
  j += fmt::format(",\n    \"buffer_bytes\": {},\n    \"overflow\": \"{}\",\n    \"overwrite\": {}",
                   o.buffer_bytes(), overflow_name(o.overflow()), o.overwrite() ? "true" : "false");
  j += fmt::format(",\n    \"stats_every\": {},\n    \"flight_recorder\": {},\n    \"flight_recorder_bytes\": {},\n    \"after_dump\": \"{}\"",
                   o.stats_every(), o.flight_recorder(), o.flight_recorder_bytes(), after_dump_name(o.after_dump()));
  if (o.format() == Format::Hdf5) {
    const Hdf5Options& h = o.hdf5();
    j += fmt::format(",\n    \"hdf5\": {{\"deflate\": {}, \"shuffle\": {}, \"chunk_bytes\": {}, \"flush_every\": {}}}",
                     h.deflate(), h.shuffle() ? "true" : "false", h.chunk_bytes(), h.flush_every());
  }
  j += "\n  },\n";
  j += fmt::format("  \"rank\": {},\n  \"world_size\": {},\n", info.rank, info.world_size);
  j += fmt::format("  \"start_time\": \"{}\",\n", info.start_time);
  j += "  \"dumps\": [";
  for (std::size_t i = 0; i < info.dumps.size(); ++i) {
    const DumpInfo& d = info.dumps[i];
    j += fmt::format("{}\n    {{\"step\": {}, \"reason\": \"{}\", \"steps\": ", i ? "," : "", d.step, d.reason);
    append_json_ints(j, d.steps);
    if (!d.name.empty()) {
      j += fmt::format(", \"kind\": \"{}\", \"name\": ", d.kind);
      append_json_string(j, d.name);
    }
    j += "}";
  }
  j += info.dumps.empty() ? "],\n" : "\n  ],\n";
  if (info.closed) {
    j += fmt::format("  \"end_time\": \"{}\",\n", info.end_time);
    j += fmt::format("  \"records\": {},\n  \"bytes\": {},\n  \"dropped\": {},\n  \"errors\": {},\n",
                     info.stats.records, info.stats.bytes, info.stats.dropped, info.stats.errors);
    if (!info.first_error.empty()) {
      j += "  \"first_error\": ";
      append_json_string(j, info.first_error.substr(0, 2000));  // run.json keeps its size
      j += ",\n";
    }
  }
  j += fmt::format("  \"closed\": {}\n}}\n", info.closed ? "true" : "false");
  // Padded with spaces (still valid JSON) to a fixed size, so the file's
  // blocks are already allocated when close() rewrites it on a full disk.
  j.append((j.size() / kRunJsonBytes + 1) * kRunJsonBytes - j.size() - 1, ' ').push_back('\n');
  const std::string path = info.run_dir + "/run.json";
  try {
    AtomicFile file(path);
    file.write(j.data(), j.size());
    file.commit();
  } catch (const Error&) {
    // No room for a temporary (disk full): overwrite the old file in place,
    // which needs no new blocks. Less safe against a crash mid-write, but
    // the alternative is a run.json that never says the run closed.
    if (!overwrite_in_place(path, j)) throw;
  }
}

void append_index_line(std::string& out, const RecordMeta& meta, const std::string& location) {
  out += fmt::format("{{\"step\":{},\"kind\":\"{}\",\"name\":", meta.step, kind_name(meta.kind));
  append_json_string(out, meta.name);
  out += fmt::format(",\"dtype\":\"{}\",\"shape\":", dtype_name(meta.dtype));
  append_json_ints(out, meta.shape);
  out += ',';
  out += location;
  out += "}\n";
}

IndexFile::IndexFile(const std::string& dir) : path_(dir + "/index.jsonl") {
  fd_ = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (fd_ < 0) throw_errno("create", path_, errno);
}

IndexFile::~IndexFile() {
  if (fd_ >= 0) ::close(fd_);
}

void IndexFile::append(const std::string& lines) {
  size_t done = 0;
  while (done < lines.size()) {
    const ssize_t n = ::write(fd_, lines.data() + done, lines.size() - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      throw_errno("append to", path_, errno);
    }
    done += static_cast<size_t>(n);
  }
}

}  // namespace tensortap::detail
