#pragma once

#include <sys/stat.h>
#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include <tensortap/error.h>

namespace tensortap::detail {

/// Throws `Error` for a failed system call on `path`: the message names the
/// action, the path and errno's text, and `code()` keeps errno itself.
[[noreturn]] void throw_errno(const std::string& action, const std::string& path, int err);

/// An open file descriptor and the path it was opened as (for messages),
/// closed when destroyed. The one owner of descriptors in tensortap, and the
/// one place that retries on EINTR and on short reads and writes. Every call
/// throws `Error` naming the path, with errno as its `code()`.
class File {
 public:
  File() = default;
  /// Takes ownership of `fd`.
  File(int fd, std::string path) : fd_(fd), path_(std::move(path)) {}
  /// Opens `path` as given, links followed: for a path the user chose.
  /// Files of a run are opened through its `Dir` instead.
  static File open(const std::string& path, int flags);
  File(File&& other) noexcept;
  File& operator=(File&& other) noexcept;
  ~File();
  File(const File&) = delete;
  File& operator=(const File&) = delete;

  explicit operator bool() const { return fd_ >= 0; }
  int fd() const { return fd_; }
  const std::string& path() const { return path_; }

  /// Writes all of `a`, then all of `b`, at the file offset, in one
  /// system call where the kernel allows.
  void write_all(const void* a, std::size_t na, const void* b = nullptr, std::size_t nb = 0);
  /// Writes all of `data` at `offset`, leaving the file offset alone. On
  /// failure `*written` (if given) says how many leading bytes went out.
  void pwrite_all(const void* data, std::size_t n, std::uint64_t offset, std::size_t* written = nullptr);
  /// Reads exactly `n` bytes at `offset`; a short file is an error.
  void pread_all(void* data, std::size_t n, std::uint64_t offset) const;
  /// Reads `n` bytes at `offset`, fewer where the file ends; returns how many.
  std::size_t pread_upto(void* data, std::size_t n, std::uint64_t offset) const;
  void datasync();
  void truncate(std::uint64_t size);
  std::uint64_t size() const;
  /// fstat() of the file.
  struct stat status() const;
  /// A second descriptor of the same open file (offset and locks shared).
  File dup() const;
  /// Takes an exclusive advisory lock (flock), which the kernel drops when
  /// the descriptor closes or the process dies; false if another holds it.
  bool try_lock();
  /// Reserves blocks up to `size` without changing the file's size, so a
  /// later write up to it needs no free space. Best effort: false where the
  /// file system cannot.
  bool reserve(std::uint64_t size) noexcept;
  /// Closes now, reporting what close() says (NFS reports write errors there).
  void close();

 private:
  int fd_ = -1;
  std::string path_;
};

/// A directory held open. Every file of a run is reached through its run
/// directory's `Dir`, by a path relative to it: the process's `chdir()` does
/// not move the run, and a symbolic link planted anywhere under it (a file,
/// a temporary name, a directory component) is refused instead of followed,
/// so nothing can make tensortap write outside the directory.
class Dir {
 public:
  Dir() = default;
  /// Opens `path` (following the links the user's own path has), creating
  /// it and its parents first if `create`.
  static Dir open(const std::string& path, bool create);

  explicit operator bool() const { return static_cast<bool>(file_); }
  int fd() const { return file_.fd(); }
  /// The path it was opened as, for messages.
  const std::string& path() const { return file_.path(); }
  /// `path()/rel`, for messages.
  std::string path_of(const std::string& rel) const;

  /// The subdirectory `rel` (one or more components), created if `create`.
  /// A component that is a link, or not a directory, is refused.
  Dir sub(const std::string& rel, bool create) const;
  /// Opens the file `rel` with `flags` (O_CREAT etc.), never through a link.
  File open_file(const std::string& rel, int flags, mode_t mode = 0644) const;
  /// Whether `rel` exists (a link counts; it is not followed).
  bool exists(const std::string& rel) const;
  /// The names in this directory (not "." or ".."), unsorted.
  std::vector<std::string> list() const;
  /// Whether `rel` is a symbolic link.
  bool is_link(const std::string& rel) const;
  /// Removes `rel`: a file, a link (not its target) or a whole tree, never
  /// following links. Nothing to remove is not an error.
  void remove_all(const std::string& rel) const;
  /// Removes the file or link `rel`; false if it was not there.
  bool unlink(const std::string& rel) const;
  /// Renames `from` to `to`, both in this directory.
  void rename(const std::string& from, const std::string& to) const;
  /// A second descriptor of the same directory, for an object that must
  /// reach it after its owner's `Dir` may be gone.
  Dir dup() const;
  void close() { file_.close(); }

 private:
  File file_;
};

/// A file written under a temporary name in its final directory and renamed
/// into place by `commit()`, so a crash never leaves a short file under the
/// final name. The temporary is created exclusively (a leftover or planted
/// one is removed first, never followed). Destroying it before `commit()`
/// removes the temporary file.
class AtomicFile {
 public:
  /// The file `name` (one component) in `dir`.
  AtomicFile(const Dir& dir, std::string name);
  ~AtomicFile();
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;

  void write(const void* a, std::size_t na, const void* b = nullptr, std::size_t nb = 0) {
    file_.write_all(a, na, b, nb);
  }
  /// See `File::reserve`.
  bool reserve(std::uint64_t size) noexcept { return file_.reserve(size); }
  /// Gives the file its name. `durable`: its data and the directory's
  /// entry are on disk when it returns (fdatasync, then the directory's fsync).
  void commit(bool durable = false);
  /// The final path, for messages.
  std::string path() const { return dir_.path_of(name_); }

 private:
  const Dir& dir_;
  std::string name_;
  std::string tmp_;
  File file_;
};

}  // namespace tensortap::detail
