// load_npy() and save_npy(): the public, synchronous way to read and write
// one .npy file. The recorder's writer thread uses NpyWriter instead.
#include <tensortap/npy.h>

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <memory>
#include <numeric>

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>
#include <fmt/format.h>

#include <tensortap/error.h>

#include "writers/src/check.h"
#include "writers/src/dtypes.h"
#include "writers/src/file.h"
#include "writers/src/npy/format.h"

namespace tensortap {
namespace {

void read_exact(const detail::File& f, void* dst, std::uint64_t n, std::uint64_t offset, const std::string& what) {
  auto* p = static_cast<char*>(dst);
  while (n > 0) {
    const auto step = static_cast<std::size_t>(std::min<std::uint64_t>(n, 1u << 30));
    try {
      f.pread_all(p, step, offset);
    } catch (const Error& e) {
      if (e.code()) throw;  // the OS's error, with the path: as it is
      detail::fail("{}: file ended early (truncated?)", what);
    }
    p += step;
    n -= step;
    offset += step;
  }
}

void swap_bytes(char* data, std::uint64_t bytes, std::size_t unit) {
  for (std::uint64_t i = 0; i + unit <= bytes; i += unit) std::reverse(data + i, data + i + unit);
}

// A file-backed tensor: the mapping lives as long as the tensor's storage.
// Maps only the pages of the data: a record of a packed segment does not
// map the whole segment.
at::Tensor map_data(int fd, std::uint64_t data_at, const detail::NpyHeader& h, const std::vector<std::int64_t>& shape,
                    const std::string& path) {
  const auto page = static_cast<std::uint64_t>(::sysconf(_SC_PAGESIZE));
  const std::uint64_t start = data_at / page * page;
  const auto len = static_cast<std::size_t>(data_at + h.data_bytes - start);
  void* base = ::mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_PRIVATE, fd, static_cast<off_t>(start));
  if (base == MAP_FAILED) detail::throw_errno("map", path, errno);
  return at::from_blob(
      static_cast<char*>(base) + (data_at - start), shape, [base, len](void*) { ::munmap(base, len); },
      at::TensorOptions().dtype(h.dtype));
}

}  // namespace

namespace {
at::Tensor load(const std::string& path, std::uint64_t offset, const LoadOptions& options, const std::string& what);

at::Tensor load_named(const std::string& path, std::uint64_t offset, const LoadOptions& options,
                      const std::string& what) {
  try {
    return load(path, offset, options, what);
  } catch (const c10::Error& e) {
    // Whatever the header checks missed, LibTorch refuses: still name the file.
    detail::fail("{}: {}", what, e.what_without_backtrace());
  }
}

}  // namespace

at::Tensor load_npy(const std::string& path, const LoadOptions& options) {
  return load_named(path, 0, options, fmt::format("load_npy: '{}'", path));
}

at::Tensor load_npy(const std::string& path, std::uint64_t offset, const LoadOptions& options) {
  return load_named(path, offset, options, fmt::format("load_npy: '{}' at offset {}", path, offset));
}

namespace {

at::Tensor load_from(const detail::File& f, const std::string& path, std::uint64_t offset, const LoadOptions& options,
                     const std::string& what);

at::Tensor load(const std::string& path, std::uint64_t offset, const LoadOptions& options, const std::string& what) {
  // O_NONBLOCK: opening a FIFO planted at `path` would otherwise wait for a
  // writer forever, before the regular-file check below could refuse it. It
  // changes nothing for a regular file.
  const detail::File f = detail::File::open(path, O_RDONLY | O_NONBLOCK);
  return load_from(f, path, offset, options, what);
}

at::Tensor load_from(const detail::File& f, const std::string& path, std::uint64_t offset, const LoadOptions& options,
                     const std::string& what) {
  const struct stat st = f.status();
  if (!S_ISREG(st.st_mode)) detail::fail("{}: not a regular file", what);
  const auto whole_size = static_cast<std::uint64_t>(st.st_size);
  // (At offset 0 an empty file is a bad magic, as it always was.)
  if (offset > 0 && offset >= whole_size)
    detail::fail("{}: the offset is at or past the end of the file ({} bytes)", what, whole_size);
  // From here on, offsets are within the image, which may run to the file's end.
  const std::uint64_t file_size = whole_size - offset;

  std::string prefix(static_cast<std::size_t>(std::min<std::uint64_t>(12, file_size)), '\0');
  read_exact(f, prefix.data(), prefix.size(), offset, what);
  // Validates the header length against the file before reading the header.
  const std::uint64_t end = detail::npy_header_end(prefix, file_size, what);
  const std::size_t have = prefix.size();
  if (end > have) {
    prefix.resize(static_cast<std::size_t>(end));
    read_exact(f, prefix.data() + have, end - have, offset + have, what);
  }
  const detail::NpyHeader h = detail::parse_npy_header(prefix, file_size, what);

  // Fortran order is the C-order array of the reversed shape, transposed.
  std::vector<std::int64_t> disk_shape = h.shape;
  if (h.fortran_order) std::reverse(disk_shape.begin(), disk_shape.end());
  const std::size_t elem = c10::elementSize(h.dtype);
  at::Tensor t;
  const std::uint64_t data_at = offset + h.data_offset;
  const bool mapped = options.mmap() && !h.swap_bytes && h.data_bytes > 0 && data_at % elem == 0;
  if (mapped) {
    t = map_data(f.fd(), data_at, h, disk_shape, path);
  } else {
    t = at::empty(disk_shape, at::TensorOptions().dtype(h.dtype));
    read_exact(f, t.data_ptr(), h.data_bytes, data_at, what);
    if (h.swap_bytes) {
      const bool complex = c10::isComplexType(h.dtype);
      swap_bytes(static_cast<char*>(t.data_ptr()), h.data_bytes, complex ? elem / 2 : elem);
    }
  }
  if (h.fortran_order && t.dim() > 1) {
    std::vector<std::int64_t> perm(t.dim());
    std::iota(perm.rbegin(), perm.rend(), 0);
    t = t.permute(perm);
    if (!mapped) t = t.contiguous();
  }
  return t;
}

}  // namespace

namespace detail {

at::Tensor load_npy_at(const Dir& dir, const std::string& rel, std::uint64_t offset) {
  const std::string what = fmt::format("'{}'{}", dir.path_of(rel), offset ? fmt::format(" at offset {}", offset) : "");
  const File f = dir.open_file(rel, O_RDONLY | O_NONBLOCK);
  try {
    return load_from(f, dir.path_of(rel), offset, LoadOptions(), what);
  } catch (const c10::Error& e) {
    fail("{}: {}", what, e.what_without_backtrace());
  }
}

}  // namespace detail

void save_npy(const std::string& path, const at::Tensor& tensor) {
  if (!tensor.defined()) detail::fail("save_npy: '{}': the tensor is undefined", path);
  const detail::DtypeInfo* info = detail::dtype_info(tensor.scalar_type());
  if (info == nullptr || tensor.layout() != at::kStrided || tensor.is_quantized())
    detail::fail("save_npy: '{}': cannot store this tensor ({})", path, detail::describe_tensor(tensor));
  c10::NoGradGuard no_grad;
  const at::Tensor data = detail::as_stored(tensor.to(at::kCPU), *info).contiguous().resolve_conj().resolve_neg();
  const std::string header = detail::npy_header(detail::npy_descr(info->element), data.sizes().vec());
  // The user's own path: its directory is followed as given, the file
  // itself is written through a temporary and renamed, never through a link.
  const std::size_t slash = path.rfind('/');
  const detail::Dir dir = detail::Dir::open(slash == std::string::npos ? "." : path.substr(0, slash + 1), false);
  detail::AtomicFile file(dir, slash == std::string::npos ? path : path.substr(slash + 1));
  file.write(header.data(), header.size(), data.data_ptr(), data.nbytes());
  file.commit();
}

}  // namespace tensortap
