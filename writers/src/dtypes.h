#pragma once

#include <string>

#include <ATen/core/Tensor.h>
#include <c10/core/ScalarType.h>

namespace tensortap::detail {

/// How a LibTorch dtype is stored on disk.
struct DtypeInfo {
  /// The dtype's name in the index and run files ("float32", "bfloat16").
  const char* name;
  /// The dtype the bytes on disk have (bfloat16 is widened to float32).
  c10::ScalarType stored;
  /// NumPy's type string for `stored`, without the byte-order character.
  const char* numpy;
};

/// Describes `dtype`, or returns nullptr when NumPy has no type for it.
const DtypeInfo* dtype_info(c10::ScalarType dtype);

/// The dtype's name as tensortap writes it ("float32"), or LibTorch's name
/// for dtypes NumPy lacks.
std::string dtype_name(c10::ScalarType dtype);

/// "dtype float32, shape [3, 4], layout Strided, device cpu", for errors.
std::string describe_tensor(const at::Tensor& t);

}  // namespace tensortap::detail
