#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include <c10/core/ScalarType.h>
#include <ATen/core/Tensor.h>
#include <c10/util/ArrayRef.h>

#include "writers/src/dtypes.h"
#include "writers/src/file.h"

namespace tensortap::detail {

/// The bytes before the data of a `.npy` file for a C-order array of this
/// NumPy type string (with byte-order character, e.g. "<f4") and shape:
/// magic, version, header length, the header dict and its padding. Format
/// 1.0, or 2.0 when the header does not fit 1.0's 16-bit length. Its size is
/// a multiple of 64, so the data that follows is 64-byte aligned.
/// With `min_size`, the header takes at least that many bytes: one that is
/// rewritten in place as its shape grows keeps its size.
std::string npy_header(std::string_view descr, c10::IntArrayRef shape, std::size_t min_size = 0);

/// One field of a structured dtype: its name and NumPy type string ("<f8").
struct NpyField {
  std::string name;
  std::string descr;
};

/// `npy_header()` of `stored`'s type string, into `out` (replacing what it
/// held): a writer that keeps `out` builds a header per record without
/// allocating.
void npy_header_into(std::string& out, Element stored, c10::IntArrayRef shape);

/// `npy_header()` for a structured dtype of these fields, in this order,
/// packed (no padding between them): NumPy reads it as a record array.
std::string npy_header(const std::vector<NpyField>& fields, c10::IntArrayRef shape, std::size_t min_size = 0);

/// The NumPy type string of `stored` in this machine's byte order ("<f4").
std::string npy_descr(Element stored);

/// What a `.npy` header says.
struct NpyHeader {
  int major_version = 1;
  c10::ScalarType dtype = c10::ScalarType::Undefined;
  /// Whether the data's byte order differs from this machine's.
  bool swap_bytes = false;
  bool fortran_order = false;
  std::vector<std::int64_t> shape;
  /// Where the data begins.
  std::size_t data_offset = 0;
  /// Bytes of data the shape and dtype call for.
  std::uint64_t data_bytes = 0;
};

/// Checks the magic, version and header length in the first bytes of a
/// `.npy` file of `file_size` bytes, and returns where the header ends.
/// At least 12 bytes (or the whole file, if shorter) must be given.
std::uint64_t npy_header_end(std::string_view first_bytes, std::uint64_t file_size, const std::string& what);

/// Parses the header at the start of `prefix`, the first `npy_header_end()`
/// bytes of a file of `file_size` bytes. Throws `Error` starting with `what` (e.g.
/// "load_npy: /path/x.npy") and naming the problem: a bad magic, a version it
/// does not know, a header length past the end, a header that is not a dict,
/// an unsupported dtype, a negative shape, or a shape whose byte count
/// overflows or exceeds the file. Never reads past `prefix`.
NpyHeader parse_npy_header(std::string_view prefix, std::uint64_t file_size, const std::string& what);

/// `load_npy()` of the file `rel` of `dir`, opened through it (no link
/// followed, never outside it), the image at `offset` (a packed segment's).
at::Tensor load_npy_at(const Dir& dir, const std::string& rel, std::uint64_t offset);

}  // namespace tensortap::detail
