#include "writers/src/run_files.h"

#include <fcntl.h>
#include <sys/file.h>

#include <algorithm>
#include <cmath>
#include <cerrno>
#include <chrono>
#include <ctime>

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

// Blocks reserved beyond run.json's end, at least this many bytes or twice
// its size, so close() can rewrite it in place on a full disk.
constexpr std::uint64_t kRunJsonReserve = 16384;

// The lock a writer holds on its run directory (see RunDir). It stays after
// the run: removing it could let a third writer in while a second waits.
constexpr const char* kLockName = ".tensortap.lock";

// A double as JSON: NaN and infinities, which JSON lacks, as null.
std::string json_number(double v) { return std::isfinite(v) ? fmt::format("{}", v) : "null"; }

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

// The journal is Hdf5Journal::kName, left by an HDF5 writer that was killed.
const char* const kRunFileNames[7] = {"run.json",  "index.jsonl", "npy", "tensors.h5", ".tensors.h5.journal",
                                      "stats.npy", "stats_series.jsonl"};

RunDir::RunDir(const std::string& root, const std::string& sub, bool overwrite) {
  Dir top = Dir::open(root, /*create=*/true);
  dir_ = sub.empty() ? std::move(top) : top.sub(sub, /*create=*/true);
  lock_ = dir_.open_file(kLockName, O_RDWR | O_CREAT);
  while (::flock(lock_.fd(), LOCK_EX | LOCK_NB) != 0) {
    if (errno == EINTR) continue;
    if (errno == EWOULDBLOCK)
      throw Error(fmt::format("tensortap: '{}' is in use by another recorder (in this process or another); two "
                              "recorders cannot write one run directory: choose another directory",
                              dir_.path()));
    throw_errno("lock", dir_.path_of(kLockName), errno);
  }
  const bool holds_run = dir_.exists("run.json") || dir_.exists("index.jsonl");
  if (holds_run && !overwrite)
    throw Error(fmt::format("tensortap: '{}' already holds a run (run.json); choose another directory or set "
                            "Options::overwrite(true)",
                            dir_.path()));
  // Only what tensortap writes goes: a user's other files stay.
  for (const char* name : kRunFileNames) {
    if (!dir_.exists(name)) continue;
    if (!overwrite)
      throw Error(fmt::format("tensortap: '{}' is in the way: the directory holds no run (no run.json) but has a "
                              "file of the name tensortap writes; remove it, choose another directory or set "
                              "Options::overwrite(true)",
                              dir_.path_of(name)));
    dir_.remove_all(name);
  }
}

void RunDir::release() noexcept {
  // Closing the lock's descriptor drops the lock.
  lock_ = File();
  dir_ = Dir();
}

void write_run_json(const Dir& dir, const Options& o, const RunInfo& info) {
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
  for (Kind k : kAllKinds) {
    if (!o.kinds().contains(k)) continue;
    j += fmt::format("{}\"{}\"", first ? "" : ", ", kind_name(k));
    first = false;
  }
  j += "],\n    \"every_by_kind\": {";
  first = true;
  for (Kind k : kAllKinds) {
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
  j += ",\n    \"dump_on\": [";
  for (std::size_t i = 0; i < o.triggers().size(); ++i) {
    const Trigger& t = o.triggers()[i];
    j += fmt::format("{}{{\"kind\": \"{}\"", i ? ", " : "", t.type_name());
    if (t.type() == Trigger::Type::Spike) {
      j += ", \"name\": ";
      append_json_string(j, t.name());
    }
    if (t.window() > 0) j += fmt::format(", \"factor\": {}, \"window\": {}", t.factor(), t.window());
    j += fmt::format(", \"cooldown\": {}}}", t.cooldown());
  }
  j += "]";
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
    const DumpRecord& d = info.dumps[i];
    j += fmt::format("{}\n    {{\"step\": {}, \"reason\": \"{}\", \"steps\": ", i ? "," : "", d.step, d.reason);
    append_json_ints(j, d.steps);
    if (d.trigger != "user") {
      j += fmt::format(", \"kind\": \"{}\", \"name\": ", kind_name(d.kind));
      append_json_string(j, d.name);
      j += fmt::format(", \"trigger\": {{\"kind\": \"{}\"", d.trigger);
      if (d.window > 0) j += fmt::format(", \"factor\": {}, \"window\": {}", d.factor, d.window);
      j += "}";
      if (d.window > 0) j += fmt::format(", \"value\": {}, \"median\": {}", json_number(d.value), json_number(d.median));
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
  const std::uint64_t reserve = std::max<std::uint64_t>(kRunJsonReserve, 2 * j.size());
  try {
    AtomicFile file(dir, "run.json");
    file.write(j.data(), j.size());
    file.reserve(reserve);
    file.commit();
  } catch (const OsError& e) {
    if (e.os_error() != ENOSPC && e.os_error() != EDQUOT) throw;
    // No room for a temporary (disk full): rewrite the old file in place,
    // in the blocks reserved when it was written. Less safe against a crash
    // mid-write, but the alternative is a run.json that never says the run
    // closed.
    File f = dir.open_file("run.json", O_WRONLY);
    f.pwrite_all(j.data(), j.size(), 0);
    if (f.size() > j.size()) f.truncate(j.size());
    f.reserve(reserve);
    f.close();
  }
}

void append_index_line(std::string& out, const RecordDesc& meta, const std::string& location) {
  out += fmt::format("{{\"step\":{},\"kind\":\"{}\",\"name\":", meta.step, kind_name(meta.kind));
  append_json_string(out, meta.name);
  out += fmt::format(",\"dtype\":\"{}\",\"shape\":", dtype_name(meta.dtype));
  append_json_ints(out, meta.shape);
  out += ',';
  out += location;
  out += "}\n";
}

LinesFile::LinesFile(const Dir& dir, const std::string& name)
    : file_(dir.open_file(name, O_WRONLY | O_CREAT | O_EXCL | O_APPEND)) {}

void LinesFile::append(const std::string& lines) {
  if (lines.empty()) return;
  try {
    if (torn_) {
      file_.write_all("\n", 1);
      ++size_;
      torn_ = false;
    }
    file_.write_all(lines.data(), lines.size());
    size_ += lines.size();
  } catch (...) {
    // A short write left part of a line: cut back to the whole lines.
    try {
      file_.truncate(size_);
    } catch (...) {
      torn_ = true;
    }
    throw;
  }
}

}  // namespace tensortap::detail
