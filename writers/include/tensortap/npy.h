#pragma once

#include <cstdint>
#include <string>

#include <ATen/core/Tensor.h>
#include <torch/arg.h>

namespace tensortap {

/// How `load_npy()` reads a file.
///
/// Example:
/// ```
/// auto t = tensortap::load_npy(path, tensortap::LoadOptions().mmap(true));
/// ```
struct LoadOptions {
  /// Map the file instead of reading it: the tensor's memory is the file's
  /// pages (copy-on-write, so writing to the tensor never changes the file),
  /// unmapped when the last tensor using it dies. Files in the other byte
  /// order, and files whose data is not aligned to its element size, are
  /// read instead. A Fortran-order file maps to a transposed (non-contiguous)
  /// view.
  TORCH_ARG(bool, mmap) = false;
};

/// Reads a `.npy` file (format 1.0, 2.0 or 3.0, either byte order, C or
/// Fortran order) into a CPU tensor: contiguous when read, possibly a
/// transposed view when mapped.
///
/// Supported dtypes: bool, uint8, int8, int16, int32, int64, float16,
/// float32, float64, complex64, complex128, and uint16, uint32 and uint64
/// with LibTorch 2.3 or later (older ones have no such tensors). A float8
/// record is stored as its bytes (`<u1`, the index line names the float8
/// type), so it reads as uint8. Throws `tensortap::Error` naming
/// the file and what is wrong for anything else, and for malformed,
/// truncated or hostile files (bad magic, a header length past the end, a
/// header that is not a dict, an object dtype, a negative shape, a shape whose
/// byte count overflows or exceeds the file). It checks sizes against the
/// file before it allocates anything.
///
/// Example:
/// ```
/// torch::Tensor w = tensortap::load_npy("runs/exp1/npy/grad/fc1.weight/00000100.npy");
/// ```
at::Tensor load_npy(const std::string& path, const LoadOptions& options = LoadOptions());

/// Reads the `.npy` image that starts `offset` bytes into `path`, as
/// `load_npy(path)` reads a whole file: for the segment files of
/// `Format::Packed`, whose index lines give each record's `"offset"`.
/// The image may run to the end of the file, no further. Errors name the
/// file and the offset.
///
/// Example:
/// ```
/// auto t = tensortap::load_npy("runs/exp1/packed/00000000.npys", 4096);
/// ```
at::Tensor load_npy(const std::string& path, std::uint64_t offset, const LoadOptions& options = LoadOptions());

/// Writes `tensor` to `path` as a `.npy` file, through a temporary file that
/// is renamed into place. bfloat16 is stored as float32, the float8 types
/// as their bytes (uint8).
///
/// Example:
/// ```
/// tensortap::save_npy("weights.npy", model->fc1->weight);
/// ```
void save_npy(const std::string& path, const at::Tensor& tensor);

}  // namespace tensortap
