#pragma once

#include <string>

#include <ATen/core/Tensor.h>

namespace tensortap {

/// Reads a `.npy` file (format 1.0, 2.0 or 3.0, either byte order, C or
/// Fortran order) into a contiguous CPU tensor.
///
/// Supported dtypes: bool, uint8, int8, int16, int32, int64, float16,
/// float32, float64, complex64, complex128. Throws `tensortap::Error` naming
/// the file and what is wrong for anything else, and for malformed files.
///
/// Example:
/// ```
/// torch::Tensor w = tensortap::load_npy("runs/exp1/npy/grad/fc1.weight/00000100.npy");
/// ```
at::Tensor load_npy(const std::string& path);

/// Writes `tensor` to `path` as a `.npy` file, through a temporary file that
/// is renamed into place. bfloat16 is stored as float32.
///
/// Example:
/// ```
/// tensortap::save_npy("weights.npy", model->fc1->weight);
/// ```
void save_npy(const std::string& path, const at::Tensor& tensor);

}  // namespace tensortap
