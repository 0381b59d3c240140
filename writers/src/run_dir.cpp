#include "writers/src/run_dir.h"

#include <optional>
#include <string_view>

#include <sys/file.h>

#include <fcntl.h>
#include <unistd.h>

#include <pthread.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <ctime>
#include <mutex>
#include <string_view>

#include <fmt/format.h>

#include "writers/src/check.h"
#include "writers/src/file.h"

namespace tensortap::detail {
namespace {

// Blocks reserved beyond run.json's end, at least this many bytes or twice
// its size, so close() can rewrite it in place on a full disk.
constexpr std::uint64_t kRunJsonReserve = 16384;

// The lock a writer holds on its run directory (see RunDir). It stays after
// the run: removing it could let a third writer in while a second waits.
constexpr const char* kLockName = ".tensortap.lock";

}  // namespace

std::string utc_now() {
  const auto now = std::chrono::system_clock::now();
  const std::time_t secs = std::chrono::system_clock::to_time_t(now);
  const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(now.time_since_epoch()).count() % 1000;
  std::tm tm{};
  ::gmtime_r(&secs, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%S", &tm);
  return fmt::format("{}.{:03d}Z", buf, ms);
}

// The journal is Hdf5Journal::kName, left by an HDF5 writer that was killed.
// The ballasts are the lines files' room where the file system has no
// fallocate (LinesFile::ballast_name).
// control, control.jsonl, control.heartbeat: tensortap ctl's channel
// (sdk/src/back/control.h).
const char* const kRunFileNames[15] = {"run.json",          "index.jsonl",         "npy",
                                       "packed",            "tensors.h5",          ".tensors.h5.journal",
                                       "stats.npy",         "stats_series.jsonl",  "dumps.jsonl",
                                       ".index.jsonl.room", ".stats_series.jsonl.room", ".dumps.jsonl.room",
                                       "control",           "control.jsonl",       "control.heartbeat"};
const char* const kEventsPrefix = "events.out.tfevents.";
const char* const kEventsSuffix = ".tensortap";

bool is_event_file_name(const std::string& name) {
  const std::string prefix = kEventsPrefix, suffix = kEventsSuffix;
  return name.size() > prefix.size() + suffix.size() && name.compare(0, prefix.size(), prefix) == 0 &&
         name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0;
}

std::string numbered_name(std::string_view stem, std::string_view ext, std::uint32_t n) {
  return n == 0 ? fmt::format("{}.{}", stem, ext) : fmt::format("{}.{}.{}", stem, n, ext);
}

std::optional<std::uint32_t> numbered_part(std::string_view name, std::string_view stem, std::string_view ext) {
  // <stem>.<n>.<ext>, n >= 1 in decimal, no leading zero, 9 digits at most.
  if (name.size() <= stem.size() + ext.size() + 2 || name.substr(0, stem.size()) != stem ||
      name[stem.size()] != '.' || name.substr(name.size() - ext.size()) != ext ||
      name[name.size() - ext.size() - 1] != '.')
    return std::nullopt;
  const std::string_view digits = name.substr(stem.size() + 1, name.size() - stem.size() - ext.size() - 2);
  if (digits.size() > 9 || digits.front() == '0') return std::nullopt;
  std::uint32_t n = 0;
  for (char c : digits) {
    if (c < '0' || c > '9') return std::nullopt;
    n = n * 10 + static_cast<std::uint32_t>(c - '0');
  }
  return n;
}

namespace {

// `name` without a lines file's ballast dots (.<name>.room), and whether it had them.
std::string_view without_ballast(std::string_view s, bool& ballast) {
  ballast = s.size() > 6 && s.front() == '.' && s.substr(s.size() - 5) == ".room";
  return ballast ? s.substr(1, s.size() - 6) : s;
}

}  // namespace

std::string index_segment_name(std::uint32_t n) { return numbered_name("index", "jsonl", n); }

bool is_index_segment_name(const std::string& name) {
  // index.<n>.jsonl, or its ballast .index.<n>.jsonl.room.
  bool ballast = false;
  return numbered_part(without_ballast(name, ballast), "index", "jsonl").has_value();
}

bool is_rolled_file_name(const std::string& name) {
  // stats.<n>.npy (no ballast: not a lines file); control.1.jsonl and
  // dumps.1.jsonl, the one older generation, with their ballasts.
  bool ballast = false;
  const std::string_view s = without_ballast(name, ballast);
  if (!ballast && numbered_part(s, "stats", "npy")) return true;
  return numbered_part(s, "control", "jsonl") == 1u || numbered_part(s, "dumps", "jsonl") == 1u;
}

std::vector<std::string> run_files_in(const Dir& dir) {
  std::vector<std::string> found;
  for (const char* name : kRunFileNames)
    if (dir.exists(name)) found.push_back(name);
  for (const std::string& name : dir.list())
    if (is_event_file_name(name) || is_index_segment_name(name) || is_rolled_file_name(name)) found.push_back(name);
  return found;
}

namespace {

bool holds_run(const Dir& dir) { return dir.exists("run.json") || dir.exists("index.jsonl"); }

// The rank<k> in a rank folder's name, or -1.
std::int64_t rank_of(const std::string& name) {
  if (name.size() < 5 || name.size() > 14 || name.compare(0, 4, "rank") != 0) return -1;
  std::int64_t k = 0;
  for (std::size_t i = 4; i < name.size(); ++i) {
    if (name[i] < '0' || name[i] > '9') return -1;
    k = k * 10 + (name[i] - '0');
  }
  return k;
}

// Removes tensortap's files (only those) from `dir`.
void remove_run_files(const Dir& dir) {
  for (const std::string& name : run_files_in(dir)) dir.remove_all(name);
}

}  // namespace

void RunDir::clear_other_runs(const Dir& top, const std::string& sub, std::int64_t world_size, bool overwrite) {
  // Another run's files where the reader would take them for this run's: a
  // single-rank run's at the root under a multi-rank run, rank folders
  // beside a single-rank run, or rank folders past this run's world size.
  // Each rank of a multi-rank run does this; removing is idempotent.
  std::vector<std::string> stale;
  if (!sub.empty() && holds_run(top)) stale.push_back("");
  for (const std::string& name : top.list()) {
    const std::int64_t k = rank_of(name);
    if (k < 0 || (!sub.empty() && k < world_size) || top.is_link(name)) continue;
    try {
      if (holds_run(top.sub(name, /*create=*/false))) stale.push_back(name);
    } catch (const Error&) {
      // Not a directory, or gone meanwhile: not a run.
    }
  }
  if (stale.empty()) return;
  const std::string found = stale.front().empty() ? top.path_of("run.json") : top.path_of(stale.front());
  if (!overwrite)
    fail("'{}' already holds another run ({}{}); choose another directory or set Options::overwrite(true)", top.path(),
         found, stale.size() > 1 ? fmt::format(" and {} more", stale.size() - 1) : "");
  for (const std::string& name : stale) {
    if (name.empty()) {
      remove_run_files(top);
      continue;
    }
    Dir d = top.sub(name, /*create=*/false);
    File lock = d.open_file(kLockName, O_RDWR | O_CREAT);
    // A rank folder some recorder holds is a live run's: not ours to remove.
    if (!lock.try_lock()) continue;
    remove_run_files(d);
    d.unlink(kLockName);
    lock.close();
    // The folder goes too when nothing of the user's is left in it.
    if (::unlinkat(top.fd(), name.c_str(), AT_REMOVEDIR) != 0 && errno != ENOTEMPTY && errno != EEXIST &&
        errno != ENOENT)
      throw_errno("remove", top.path_of(name), errno);
  }
}

RunDir::RunDir(const std::string& root, const std::string& sub, bool overwrite, std::int64_t world_size) {
  Dir top = Dir::open(root, /*create=*/true);
  clear_other_runs(top, sub, world_size, overwrite);
  dir_ = sub.empty() ? std::move(top) : top.sub(sub, /*create=*/true);
  File lock = dir_.open_file(kLockName, O_RDWR | O_CREAT);
  if (!lock.try_lock())
    fail(
        "'{}' is in use by another recorder (in this process or another); two recorders cannot write one run "
        "directory: choose another directory",
        dir_.path());
  lock_.hold(std::move(lock));
  // Either file marks a run; the message names the one found.
  const char* const run_file = dir_.exists("run.json")      ? "run.json"
                               : dir_.exists("index.jsonl") ? "index.jsonl"
                                                            : nullptr;
  if (run_file != nullptr && !overwrite)
    fail(
        "'{}' already holds a run ({}); choose another directory or set "
        "Options::overwrite(true)",
        dir_.path(), run_file);
  // Only what tensortap writes goes: a user's other files stay.
  for (const std::string& name : run_files_in(dir_)) {
    if (!overwrite)
      fail(
          "'{}' is in the way: the directory holds no run (no run.json) but has a "
          "file of the name tensortap writes; remove it, choose another directory or set "
          "Options::overwrite(true)",
          dir_.path_of(name));
    dir_.remove_all(name);
  }
}

void RunDir::release() noexcept {
  // Closing the lock's descriptor drops the lock.
  lock_.reset();
  dir_ = Dir();
}

namespace {

// The run directories' locks this process holds, as descriptor + 1 (0: a
// free slot): the fork() child handler closes them, and it may neither
// allocate nor take a lock, hence atomic slots. Past kLockSlots recorders
// open at once, a child keeps the further locks (as before this).
constexpr std::size_t kLockSlots = 256;
std::atomic<int> g_lock_slots[kLockSlots];

void close_locks_in_child() {
  for (std::atomic<int>& slot : g_lock_slots) {
    const int v = slot.exchange(0, std::memory_order_relaxed);
    if (v > 0) ::close(v - 1);  // async-signal-safe
  }
}

}  // namespace

void RunDir::Lock::hold(File file) {
  static std::once_flag registered;
  std::call_once(registered, [] { ::pthread_atfork(nullptr, nullptr, close_locks_in_child); });
  reset();
  file_ = std::move(file);
  owner_ = ::getpid();
  for (std::atomic<int>& slot : g_lock_slots) {
    int free = 0;
    if (slot.compare_exchange_strong(free, file_.fd() + 1, std::memory_order_relaxed)) break;
  }
}

void RunDir::Lock::reset() noexcept {
  if (!file_) return;
  // Out of the slots before the descriptor closes: a fork() in between
  // must not close another file that reuses its number in the child.
  for (std::atomic<int>& slot : g_lock_slots) {
    int mine = file_.fd() + 1;
    if (slot.compare_exchange_strong(mine, 0, std::memory_order_relaxed)) break;
  }
  // Unlocked before it closes: the flock belongs to the open file
  // description, which a fork() child shares until its atfork handler has
  // closed its copy, and a child not yet scheduled has not. Closing alone
  // left the directory locked in that window (a new recorder there was
  // refused, now and then). Only by the process that took it: a child's
  // unlock would release its parent's lock.
  if (owner_ == ::getpid()) (void)::flock(file_.fd(), LOCK_UN);
  file_ = File();
}

std::uint64_t write_run_json(const Dir& dir, const std::string& json, bool durable) {
  const std::uint64_t reserve = std::max<std::uint64_t>(kRunJsonReserve, 2 * json.size());
  try {
    AtomicFile file(dir, "run.json");
    file.write(json.data(), json.size());
    file.reserve(reserve);
    file.commit(durable);
  } catch (const Error& e) {
    if (e.code() != std::errc::no_space_on_device && e.code() != std::error_code(EDQUOT, std::system_category())) throw;
    // No room for a temporary (disk full): rewrite the old file in place,
    // in the blocks reserved when it was written. Less safe against a crash
    // mid-write, but the alternative is a run.json that never says the run
    // closed. At open there is no old file: the full disk is the error to
    // report, not the missing file (ENOENT would mislead).
    if (!dir.exists("run.json")) throw;
    File f = dir.open_file("run.json", O_WRONLY);
    f.pwrite_all(json.data(), json.size(), 0);
    if (f.size() > json.size()) f.truncate(json.size());
    f.reserve(reserve);
    if (durable) f.datasync();
    f.close();
  }
  return reserve;
}

bool reserve_run_json(const Dir& dir, std::uint64_t bytes) noexcept {
  try {
    File f = dir.open_file("run.json", O_WRONLY);
    const bool reserved = f.reserve(bytes);
    f.close();
    return reserved;
  } catch (...) {
    return false;
  }
}

}  // namespace tensortap::detail
