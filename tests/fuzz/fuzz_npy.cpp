// libFuzzer target for the .npy header parser and reader (tests/README.md).
// Each input is tried as a whole file: parsed from memory, then read and
// mapped from a file, as load_npy does with what it is given.
#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <string>
#include <string_view>

#include <ATen/ATen.h>

#include <tensortap/error.h>
#include <tensortap/npy.h>

#include "writers/src/npy/format.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view bytes(reinterpret_cast<const char*>(data), size);
  try {
    const std::uint64_t end = tensortap::detail::npy_header_end(bytes.substr(0, 12), size, "fuzz");
    if (end <= size) tensortap::detail::parse_npy_header(bytes.substr(0, end), size, "fuzz");
  } catch (const tensortap::Error&) {
  }
  // A memory-backed file, so the reader runs its real path.
  const int fd = ::memfd_create("fuzz.npy", 0);
  if (fd < 0) return 0;
  if (::write(fd, data, size) == static_cast<ssize_t>(size)) {
    const std::string path = "/proc/self/fd/" + std::to_string(fd);
    for (bool mmap : {false, true}) {
      try {
        const at::Tensor t = tensortap::load_npy(path, tensortap::LoadOptions().mmap(mmap));
        // Touch every byte: a wrong size would read out of bounds here.
        if (t.numel() > 0) (void)t.contiguous().reshape(-1).view(at::kByte).sum().item<std::int64_t>();
      } catch (const tensortap::Error&) {
      }
    }
  }
  ::close(fd);
  return 0;
}
