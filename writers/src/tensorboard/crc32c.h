#pragma once

#include <cstddef>
#include <cstdint>

namespace tensortap::detail {

/// CRC-32C (Castagnoli) of `n` bytes, continuing from `crc` (0 to start):
/// SSE4.2's crc32 instruction where the CPU has it, a table otherwise.
std::uint32_t crc32c(const void* data, std::size_t n, std::uint32_t crc = 0) noexcept;
/// The same by the table only: the portable path, and the tests' reference.
std::uint32_t crc32c_table(const void* data, std::size_t n, std::uint32_t crc = 0) noexcept;
/// TFRecord's masked form of a CRC (EVENTS.md): a CRC stored next to the
/// data it covers would otherwise be easy to confuse with data.
inline std::uint32_t masked_crc32c(const void* data, std::size_t n) noexcept {
  const std::uint32_t c = crc32c(data, n);
  return ((c >> 15) | (c << 17)) + 0xa282ead8u;
}

}  // namespace tensortap::detail
