#include "writers/src/file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include <fmt/format.h>

#include <tensortap/error.h>

namespace tensortap::detail {

void throw_errno(const std::string& action, const std::string& path, int err) {
  throw Error(fmt::format("tensortap: cannot {} '{}': {} (errno {})", action, path,
                          std::strerror(err), err));
}

void make_dirs(const std::string& dir) {
  std::string partial;
  partial.reserve(dir.size());
  for (size_t i = 0; i <= dir.size(); ++i) {
    if (i == dir.size() || (dir[i] == '/' && i > 0)) {
      partial.assign(dir, 0, i);
      if (::mkdir(partial.c_str(), 0755) != 0 && errno != EEXIST)
        throw_errno("create directory", partial, errno);
    }
  }
  struct stat st {};
  if (::stat(dir.c_str(), &st) != 0) throw_errno("create directory", dir, errno);
  if (!S_ISDIR(st.st_mode)) throw_errno("create directory", dir, ENOTDIR);
}

AtomicFile::AtomicFile(std::string final_path) : final_(std::move(final_path)) {
  const size_t slash = final_.rfind('/');
  const size_t base = slash == std::string::npos ? 0 : slash + 1;
  // A leading dot keeps the temporary out of `ls` and out of the reader's
  // globs; the .tmp suffix says what it is if a crash leaves it behind.
  tmp_ = final_.substr(0, base) + "." + final_.substr(base) + ".tmp";
  fd_ = ::open(tmp_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd_ < 0) throw_errno("create", tmp_, errno);
}

AtomicFile::~AtomicFile() {
  if (fd_ >= 0) {
    ::close(fd_);
    ::unlink(tmp_.c_str());
  }
}

void AtomicFile::write(const void* a, std::size_t na, const void* b, std::size_t nb) {
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
      throw_errno("write", tmp_, errno);
    }
    auto left = static_cast<size_t>(n);
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

void AtomicFile::commit() {
  const int fd = fd_;
  fd_ = -1;
  if (::close(fd) != 0) {
    const int err = errno;
    ::unlink(tmp_.c_str());
    throw_errno("write", tmp_, err);
  }
  if (::rename(tmp_.c_str(), final_.c_str()) != 0) {
    const int err = errno;
    ::unlink(tmp_.c_str());
    throw_errno("rename into", final_, err);
  }
}

}  // namespace tensortap::detail
