#pragma once

#include <cstddef>
#include <string>

namespace tensortap::detail {

/// A file written under a temporary name in its final directory and renamed
/// into place by `commit()`, so a crash never leaves a short file under the
/// final name. Destroying it before `commit()` removes the temporary file.
/// Every failure throws `Error` with the path and errno.
class AtomicFile {
 public:
  explicit AtomicFile(std::string final_path);
  ~AtomicFile();
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;

  /// Writes all of `a` then all of `b` (either may be empty), in one
  /// system call where the kernel allows.
  void write(const void* a, std::size_t na, const void* b = nullptr, std::size_t nb = 0);
  void commit();
  const std::string& path() const { return final_; }

 private:
  std::string final_;
  std::string tmp_;
  int fd_ = -1;
};

/// Creates `dir` and its parents. Throws `Error` with the path and errno.
void make_dirs(const std::string& dir);

/// Reports a failed system call on `path` as `Error`, with errno's text.
[[noreturn]] void throw_errno(const std::string& action, const std::string& path, int err);

}  // namespace tensortap::detail
