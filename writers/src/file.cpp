#include "writers/src/file.h"

#include <dirent.h>
#include <fcntl.h>
#include <linux/openat2.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <vector>

#include <fmt/format.h>

#include "writers/src/check.h"

namespace tensortap::detail {
namespace {

std::vector<std::string> components(const std::string& rel) {
  std::vector<std::string> out;
  std::size_t i = 0;
  while (i <= rel.size()) {
    const std::size_t j = std::min(rel.find('/', i), rel.size());
    if (j > i) out.push_back(rel.substr(i, j - i));
    i = j + 1;
  }
  return out;
}

void check_relative(const std::string& rel, const std::string& where) {
  if (rel.empty() || rel.front() == '/') fail("'{}' is not a path inside the run directory '{}'", rel, where);
  for (const std::string& c : components(rel))
    if (c == "..") fail("'{}' leaves the run directory '{}'", rel, where);
}

// openat() that resolves `rel` strictly below `dirfd` and through no link at
// all. openat2() does it in one call where the kernel has it (5.6 and
// later); elsewhere each component is opened with O_NOFOLLOW in turn.
int open_beneath(int dirfd, const std::string& rel, int flags, mode_t mode) {
#ifdef SYS_openat2
  static std::atomic<bool> have_openat2{true};
  if (have_openat2.load(std::memory_order_relaxed)) {
    open_how how{};
    how.flags = static_cast<std::uint64_t>(flags | O_CLOEXEC);
    how.mode = (flags & O_CREAT) != 0 ? mode : 0;
    how.resolve = RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS;
    for (;;) {
      const long fd = ::syscall(SYS_openat2, dirfd, rel.c_str(), &how, sizeof how);
      if (fd >= 0) return static_cast<int>(fd);
      if (errno == EINTR || errno == EAGAIN) continue;
      // Seccomp filters in some containers answer EPERM for unknown calls.
      if (errno != ENOSYS && errno != EPERM) return -1;
      have_openat2.store(false, std::memory_order_relaxed);
      break;
    }
  }
#endif
  const std::vector<std::string> parts = components(rel);
  int cur = dirfd;
  for (std::size_t i = 0; i + 1 < parts.size(); ++i) {
    const int next = ::openat(cur, parts[i].c_str(), O_PATH | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    const int err = errno;
    if (cur != dirfd) ::close(cur);
    if (next < 0) {
      errno = err;
      return -1;
    }
    cur = next;
  }
  int fd;
  do {
    fd = ::openat(cur, parts.back().c_str(), flags | O_NOFOLLOW | O_CLOEXEC, mode);
  } while (fd < 0 && errno == EINTR);
  const int err = errno;
  if (cur != dirfd) ::close(cur);
  errno = err;
  return fd;
}

// The parent directory of `rel` (opened beneath `dirfd`) and its last component.
std::pair<File, std::string> parent_of(const Dir& dir, const std::string& rel) {
  const std::size_t slash = rel.rfind('/');
  if (slash == std::string::npos) return {File(), rel};
  const std::string parent = rel.substr(0, slash);
  const int fd = open_beneath(dir.fd(), parent, O_PATH | O_DIRECTORY, 0);
  if (fd < 0) throw_errno("open directory", dir.path_of(parent), errno);
  return {File(fd, dir.path_of(parent)), rel.substr(slash + 1)};
}

// The names in the directory open at `dirfd` (not "." or ".."), read
// through a descriptor of their own: readdir moves the one it reads.
std::vector<std::string> names_in(int dirfd, const std::string& path) {
  const int fd = ::openat(dirfd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) throw_errno("open directory", path, errno);
  DIR* d = ::fdopendir(fd);
  if (d == nullptr) {
    const int err = errno;
    ::close(fd);
    throw_errno("read directory", path, err);
  }
  std::vector<std::string> names;
  while (const dirent* e = ::readdir(d)) {
    const std::string n = e->d_name;
    if (n != "." && n != "..") names.push_back(n);
  }
  ::closedir(d);
  return names;
}

void remove_tree(int dirfd, const std::string& name, const std::string& path) {
  struct stat st {};
  if (::fstatat(dirfd, name.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0) {
    if (errno == ENOENT) return;
    throw_errno("stat", path, errno);
  }
  if (S_ISDIR(st.st_mode)) {
    const int fd = ::openat(dirfd, name.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0) throw_errno("open directory", path, errno);
    try {
      for (const std::string& n : names_in(fd, path)) remove_tree(fd, n, path + "/" + n);
    } catch (...) {
      ::close(fd);
      throw;
    }
    ::close(fd);
    if (::unlinkat(dirfd, name.c_str(), AT_REMOVEDIR) != 0 && errno != ENOENT) throw_errno("remove", path, errno);
    return;
  }
  if (::unlinkat(dirfd, name.c_str(), 0) != 0 && errno != ENOENT) throw_errno("remove", path, errno);
}

}  // namespace

void throw_errno(const std::string& action, const std::string& path, int err) {
  fail(std::error_code(err, std::system_category()), "cannot {} '{}': {} (errno {})", action, path, std::strerror(err),
       err);
}

File::File(File&& other) noexcept : fd_(other.fd_), path_(std::move(other.path_)) { other.fd_ = -1; }

File& File::operator=(File&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = other.fd_;
    path_ = std::move(other.path_);
    other.fd_ = -1;
  }
  return *this;
}

File::~File() {
  if (fd_ >= 0) ::close(fd_);
}

void File::write_all(const void* a, std::size_t na, const void* b, std::size_t nb) {
  iovec iov[2] = {{const_cast<void*>(a), na}, {const_cast<void*>(b), nb}};
  int first = 0;
  while (first < 2) {
    if (iov[first].iov_len == 0) {
      ++first;
      continue;
    }
    const ssize_t n = ::writev(fd_, iov + first, 2 - first);
    if (n < 0) {
      if (errno == EINTR) continue;
      throw_errno("write", path_, errno);
    }
    auto left = static_cast<std::size_t>(n);
    while (first < 2 && left >= iov[first].iov_len) {
      left -= iov[first].iov_len;
      iov[first].iov_len = 0;
      ++first;
    }
    if (first < 2) {
      iov[first].iov_base = static_cast<char*>(iov[first].iov_base) + left;
      iov[first].iov_len -= left;
    }
  }
}

void File::pwrite_all(const void* data, std::size_t n, std::uint64_t offset, std::size_t* written) {
  const char* p = static_cast<const char*>(data);
  if (written != nullptr) *written = 0;
  while (n > 0) {
    const ssize_t w = ::pwrite(fd_, p, n, static_cast<off_t>(offset));
    if (w < 0) {
      if (errno == EINTR) continue;
      throw_errno("write", path_, errno);
    }
    if (written != nullptr) *written += static_cast<std::size_t>(w);
    p += w;
    n -= static_cast<std::size_t>(w);
    offset += static_cast<std::uint64_t>(w);
  }
}

void File::pread_all(void* data, std::size_t n, std::uint64_t offset) const {
  if (pread_upto(data, n, offset) != n) fail("'{}' ended early (truncated?)", path_);
}

std::size_t File::pread_upto(void* data, std::size_t n, std::uint64_t offset) const {
  char* p = static_cast<char*>(data);
  std::size_t got = 0;
  while (got < n) {
    const ssize_t r = ::pread(fd_, p + got, n - got, static_cast<off_t>(offset + got));
    if (r < 0) {
      if (errno == EINTR) continue;
      throw_errno("read", path_, errno);
    }
    if (r == 0) break;
    got += static_cast<std::size_t>(r);
  }
  return got;
}

void File::datasync() {
  if (::fdatasync(fd_) != 0) throw_errno("fsync", path_, errno);
}

void File::truncate(std::uint64_t size) {
  while (::ftruncate(fd_, static_cast<off_t>(size)) != 0)
    if (errno != EINTR) throw_errno("truncate", path_, errno);
}

std::uint64_t File::size() const { return static_cast<std::uint64_t>(status().st_size); }

struct stat File::status() const {
  struct stat st {};
  if (::fstat(fd_, &st) != 0) throw_errno("stat", path_, errno);
  return st;
}

File File::dup() const {
  const int fd = ::fcntl(fd_, F_DUPFD_CLOEXEC, 0);
  if (fd < 0) throw_errno("duplicate the descriptor of", path_, errno);
  return File(fd, path_);
}

Dir Dir::dup() const {
  Dir d;
  d.file_ = file_.dup();
  return d;
}

bool File::try_lock() {
  while (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
    if (errno == EINTR) continue;
    if (errno == EWOULDBLOCK) return false;
    throw_errno("lock", path_, errno);
  }
  return true;
}

bool File::reserve(std::uint64_t size) noexcept {
  return ::fallocate(fd_, FALLOC_FL_KEEP_SIZE, 0, static_cast<off_t>(size)) == 0;
}

void File::close() {
  if (fd_ < 0) return;
  const int fd = fd_;
  fd_ = -1;
  // Linux closes the descriptor even when close() fails: never retry it.
  if (::close(fd) != 0 && errno != EINTR) throw_errno("write", path_, errno);
}

File File::open(const std::string& path, int flags) {
  int fd;
  do {
    fd = ::open(path.c_str(), flags | O_CLOEXEC, 0644);
  } while (fd < 0 && errno == EINTR);
  if (fd < 0) throw_errno((flags & O_CREAT) != 0 ? "create" : "open", path, errno);
  return File(fd, path);
}

Dir Dir::open(const std::string& path, bool create) {
  if (path.empty()) fail("the run directory is empty");
  if (create) {
    std::string partial;
    for (std::size_t i = 0; i <= path.size(); ++i) {
      if (i == path.size() || (path[i] == '/' && i > 0)) {
        partial.assign(path, 0, i);
        if (::mkdir(partial.c_str(), 0755) != 0 && errno != EEXIST) throw_errno("create directory", partial, errno);
      }
    }
  }
  const int fd = ::open(path.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) throw_errno("open directory", path, errno);
  Dir d;
  d.file_ = File(fd, path);
  return d;
}

std::string Dir::path_of(const std::string& rel) const {
  return path().empty() || path().back() == '/' ? path() + rel : path() + "/" + rel;
}

Dir Dir::sub(const std::string& rel, bool create) const {
  check_relative(rel, path());
  if (create) {
    std::string partial;
    for (const std::string& c : components(rel)) {
      partial = partial.empty() ? c : partial + "/" + c;
      auto [parent, name] = parent_of(*this, partial);
      const int at = parent ? parent.fd() : fd();
      if (::mkdirat(at, name.c_str(), 0755) != 0 && errno != EEXIST)
        throw_errno("create directory", path_of(partial), errno);
    }
  }
  const int fd = open_beneath(this->fd(), rel, O_RDONLY | O_DIRECTORY, 0);
  if (fd < 0) {
    const int err = errno;
    if (err == ELOOP || err == EXDEV || err == ENOTDIR)
      fail(
          "'{}' is a symbolic link or not a directory; tensortap does not "
          "follow links inside a run directory",
          path_of(rel));
    throw_errno("open directory", path_of(rel), err);
  }
  Dir d;
  d.file_ = File(fd, path_of(rel));
  return d;
}

File Dir::open_file(const std::string& rel, int flags, mode_t mode) const {
  check_relative(rel, path());
  const int fd = open_beneath(this->fd(), rel, flags, mode);
  if (fd < 0) {
    const int err = errno;
    if (err == ELOOP || err == EXDEV)
      fail(
          "'{}' is (or lies under) a symbolic link; tensortap does not "
          "follow links inside a run directory",
          path_of(rel));
    throw_errno((flags & O_CREAT) != 0 ? "create" : "open", path_of(rel), err);
  }
  return File(fd, path_of(rel));
}

bool Dir::exists(const std::string& rel) const {
  check_relative(rel, path());
  auto [parent, name] = parent_of(*this, rel);
  struct stat st {};
  return ::fstatat(parent ? parent.fd() : fd(), name.c_str(), &st, AT_SYMLINK_NOFOLLOW) == 0;
}

std::vector<std::string> Dir::list() const { return names_in(fd(), path()); }

bool Dir::is_link(const std::string& rel) const {
  check_relative(rel, path());
  auto [parent, name] = parent_of(*this, rel);
  struct stat st {};
  return ::fstatat(parent ? parent.fd() : fd(), name.c_str(), &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISLNK(st.st_mode);
}

void Dir::remove_all(const std::string& rel) const {
  check_relative(rel, path());
  auto [parent, name] = parent_of(*this, rel);
  remove_tree(parent ? parent.fd() : fd(), name, path_of(rel));
}

bool Dir::unlink(const std::string& rel) const {
  check_relative(rel, path());
  auto [parent, name] = parent_of(*this, rel);
  if (::unlinkat(parent ? parent.fd() : fd(), name.c_str(), 0) == 0) return true;
  if (errno == ENOENT) return false;
  throw_errno("remove", path_of(rel), errno);
}

void Dir::rename(const std::string& from, const std::string& to) const {
  check_relative(from, path());
  check_relative(to, path());
  auto [pf, nf] = parent_of(*this, from);
  auto [pt, nt] = parent_of(*this, to);
  if (::renameat(pf ? pf.fd() : fd(), nf.c_str(), pt ? pt.fd() : fd(), nt.c_str()) != 0)
    throw_errno("rename into", path_of(to), errno);
}

AtomicFile::AtomicFile(const Dir& dir, std::string name) : dir_(dir), name_(std::move(name)) {
  // A leading dot keeps the temporary out of `ls` and out of the reader's
  // globs; the .tmp suffix says what it is if a crash leaves it behind.
  tmp_ = "." + name_ + ".tmp";
  const int flags = O_WRONLY | O_CREAT | O_EXCL;
  try {
    file_ = dir_.open_file(tmp_, flags);
  } catch (const Error&) {
    // A temporary left by a crash, or a link planted in its place: remove
    // the name itself (never what a link points to) and create it anew.
    if (!dir_.unlink(tmp_)) throw;
    file_ = dir_.open_file(tmp_, flags);
  }
}

AtomicFile::~AtomicFile() {
  if (file_) {
    file_ = File();
    try {
      dir_.unlink(tmp_);
    } catch (...) {
    }
  }
}

void AtomicFile::commit(bool durable) {
  try {
    if (durable) file_.datasync();
    file_.close();
    dir_.rename(tmp_, name_);
    if (durable && ::fsync(dir_.fd()) != 0 && errno != EINVAL) throw_errno("sync", dir_.path(), errno);
  } catch (...) {
    try {
      dir_.unlink(tmp_);
    } catch (...) {
    }
    throw;
  }
}

}  // namespace tensortap::detail
