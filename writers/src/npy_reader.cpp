// load_npy() and save_npy(): the public, synchronous way to read and write
// one .npy file. The recorder's writer thread uses NpyWriter instead.
#include <tensortap/npy.h>

#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <memory>
#include <numeric>

#include <ATen/ATen.h>
#include <fmt/format.h>

#include <tensortap/error.h>

#include "writers/src/dtypes.h"
#include "writers/src/file.h"
#include "writers/src/npy_format.h"

namespace tensortap {
namespace {

struct FileCloser {
  void operator()(std::FILE* f) const { std::fclose(f); }
};

void read_exact(std::FILE* f, void* dst, std::size_t n, const std::string& what) {
  if (n != 0 && std::fread(dst, 1, n, f) != n)
    throw Error(fmt::format("{}: file ended early (truncated?)", what));
}

void swap_bytes(char* data, std::uint64_t bytes, std::size_t unit) {
  for (std::uint64_t i = 0; i + unit <= bytes; i += unit) std::reverse(data + i, data + i + unit);
}

}  // namespace

at::Tensor load_npy(const std::string& path) {
  const std::string what = fmt::format("tensortap::load_npy: '{}'", path);
  std::unique_ptr<std::FILE, FileCloser> f(std::fopen(path.c_str(), "rb"));
  if (!f) detail::throw_errno("open", path, errno);
  struct stat st {};
  if (::fstat(::fileno(f.get()), &st) != 0) detail::throw_errno("stat", path, errno);
  if (!S_ISREG(st.st_mode)) throw Error(fmt::format("{}: not a regular file", what));
  const auto file_size = static_cast<std::uint64_t>(st.st_size);

  std::string prefix(static_cast<std::size_t>(std::min<std::uint64_t>(12, file_size)), '\0');
  read_exact(f.get(), prefix.data(), prefix.size(), what);
  const std::uint64_t end = detail::npy_header_end(prefix, file_size, what);
  const std::size_t have = prefix.size();
  prefix.resize(static_cast<std::size_t>(end));
  if (end > have) read_exact(f.get(), prefix.data() + have, end - have, what);
  // The header ends at `end`, which may be before byte 12 only in a broken file.
  if (std::fseek(f.get(), static_cast<long>(end), SEEK_SET) != 0)
    detail::throw_errno("seek in", path, errno);
  const detail::NpyHeader h = detail::parse_npy_header(prefix, file_size, what);

  // Fortran order is the C-order array of the reversed shape, transposed.
  std::vector<std::int64_t> disk_shape = h.shape;
  if (h.fortran_order) std::reverse(disk_shape.begin(), disk_shape.end());
  at::Tensor t = at::empty(disk_shape, at::TensorOptions().dtype(h.dtype));
  read_exact(f.get(), t.data_ptr(), h.data_bytes, what);
  if (h.swap_bytes) {
    const bool complex = c10::isComplexType(h.dtype);
    const std::size_t elem = c10::elementSize(h.dtype);
    swap_bytes(static_cast<char*>(t.data_ptr()), h.data_bytes, complex ? elem / 2 : elem);
  }
  if (h.fortran_order && t.dim() > 1) {
    std::vector<std::int64_t> perm(t.dim());
    std::iota(perm.rbegin(), perm.rend(), 0);
    t = t.permute(perm).contiguous();
  }
  return t;
}

void save_npy(const std::string& path, const at::Tensor& tensor) {
  if (!tensor.defined()) throw Error(fmt::format("tensortap::save_npy: '{}': the tensor is undefined", path));
  const detail::DtypeInfo* info = detail::dtype_info(tensor.scalar_type());
  if (info == nullptr || tensor.layout() != at::kStrided || tensor.is_quantized())
    throw Error(fmt::format("tensortap::save_npy: '{}': cannot store this tensor ({})", path,
                            detail::describe_tensor(tensor)));
  at::NoGradGuard no_grad;
  const at::Tensor data =
      tensor.to(at::kCPU, info->stored, /*non_blocking=*/false, /*copy=*/false).contiguous();
  const std::string header = detail::npy_header(detail::npy_descr(info->stored), data.sizes().vec());
  detail::AtomicFile file(path);
  file.write(header.data(), header.size(), data.data_ptr(), data.nbytes());
  file.commit();
}

}  // namespace tensortap
