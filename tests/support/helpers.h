#pragma once

#include <fcntl.h>
#include <sys/resource.h>
#include <unistd.h>

#include <csignal>
#include <cstdio>
#include <cstdint>
#include <cstdlib>
#include <algorithm>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include <catch2/catch.hpp>
#include <fmt/format.h>

#include <tensortap/error.h>

namespace tt_test {

/// What `f` throws as a tensortap::Error, or "" if it returns.
inline std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const tensortap::Error& e) {
    return e.what();
  }
  return "";
}

/// Until the scope ends, a write that would take any file past `bytes` fails
/// (EFBIG, with SIGXFSZ ignored): a full disk in miniature.
class FileSizeLimit {
 public:
  explicit FileSizeLimit(rlim_t bytes) : handler_(::signal(SIGXFSZ, SIG_IGN)) {
    REQUIRE(::getrlimit(RLIMIT_FSIZE, &old_) == 0);
    rlimit small = old_;
    small.rlim_cur = bytes;
    REQUIRE(::setrlimit(RLIMIT_FSIZE, &small) == 0);
  }
  ~FileSizeLimit() { lift(); }
  FileSizeLimit(const FileSizeLimit&) = delete;
  FileSizeLimit& operator=(const FileSizeLimit&) = delete;
  /// Ends the limit before the scope does.
  void lift() {
    if (lifted_) return;
    ::setrlimit(RLIMIT_FSIZE, &old_);
    ::signal(SIGXFSZ, handler_);
    lifted_ = true;
  }

 private:
  rlimit old_{};
  void (*handler_)(int);
  bool lifted_ = false;
};

/// A fresh directory under the system temp dir, removed at scope exit.
struct TempDir {
  std::string path;
  TempDir() {
    std::string pattern = (std::filesystem::temp_directory_path() / "tensortap-test-XXXXXX").string();
    REQUIRE(::mkdtemp(pattern.data()) != nullptr);
    path = pattern;
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
  std::string operator/(const std::string& rel) const { return path + "/" + rel; }
};

inline std::vector<std::string> read_lines(const std::string& path) {
  std::ifstream in(path);
  std::vector<std::string> lines;
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

inline std::string read_file(const std::string& path);

// What `f` printed on stderr (file descriptor 2), through the file `path`.
template <typename F>
std::string stderr_of(const std::string& path, F&& f) {
  std::fflush(stderr);
  const int saved = ::dup(2);
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  REQUIRE((saved >= 0 && fd >= 0));
  ::dup2(fd, 2);
  ::close(fd);
  const auto restore = [&] {
    std::fflush(stderr);
    ::dup2(saved, 2);
    ::close(saved);
  };
  try {
    f();
  } catch (...) {
    restore();
    throw;
  }
  restore();
  return read_file(path);
}

inline std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

/// The file of a record written as .npy: `<run>/npy/<kind>/<name>/<step>.npy`,
/// the step in 8 digits. `name` is used as given: a name the writers encode
/// (tensortap::detail::encode_name) must be passed encoded.
inline std::string npy(const std::string& run, const std::string& kind, const std::string& name, std::int64_t step) {
  return fmt::format("{}/npy/{}/{}/{:08d}.npy", run, kind, name, step);
}

/// Index lines that mention `needle`.
inline std::vector<std::string> index_lines_with(const std::string& run, const std::string& needle) {
  std::vector<std::string> out;
  for (const auto& l : read_lines(run + "/index.jsonl"))
    if (l.find(needle) != std::string::npos) out.push_back(l);
  return out;
}

/// Regular files under `dir`, recursively.
inline std::vector<std::filesystem::path> files_under(const std::string& dir) {
  std::vector<std::filesystem::path> out;
  for (const auto& e : std::filesystem::recursive_directory_iterator(dir))
    if (e.is_regular_file()) out.push_back(e.path());
  return out;
}

/// Checks that runs `a` and `b` of one program hold the same files, byte
/// for byte: all but run.json (which holds the run's own path and times)
/// and `control*`. Returns how many gradient records (`npy/grad/`) they hold.
inline std::size_t check_same_records(const std::string& a, const std::string& b) {
  const auto files = [](const std::string& run) {
    std::vector<std::string> out;
    for (const auto& p : files_under(run)) {
      const std::string rel = std::filesystem::relative(p, run).string();
      if (rel != "run.json" && rel.rfind("control", 0) != 0) out.push_back(rel);
    }
    std::sort(out.begin(), out.end());
    return out;
  };
  const std::vector<std::string> in_a = files(a), in_b = files(b);
  CHECK(in_a == in_b);
  for (const std::string& f : in_a) {
    INFO(f);
    CHECK(read_file(a + "/" + f) == read_file(b + "/" + f));
  }
  return static_cast<std::size_t>(
      std::count_if(in_a.begin(), in_a.end(), [](const std::string& f) { return f.rfind("npy/grad/", 0) == 0; }));
}

}  // namespace tt_test
