#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>

#include <ATen/core/Tensor.h>
#include <c10/core/ScalarType.h>

namespace tensortap::detail {

/// What one element of a record's bytes on disk holds. tensortap's own
/// list, not LibTorch's: LibTorch 1.13 has no uint16 or float8 ScalarType,
/// yet the writers, the statistics and their tests handle them there too.
enum class Element : std::uint8_t {
  Bool,
  U8,
  I8,
  I16,
  I32,
  I64,
  U16,
  U32,
  U64,
  F16,
  F32,
  F64,
  C64,
  C128,
  // float8 values as their bit patterns, one byte each (NumPy has no
  // float8): the file holds uint8, the index names the format.
  F8E4M3FN,
  F8E5M2,
  F8E4M3FNUZ,
  F8E5M2FNUZ,
  F8E8M0FNU,
};

/// Bytes of one element.
std::size_t element_size(Element e);

/// NumPy's type string of an element on disk, without the byte-order
/// character ("f4"; "u1" for a float8).
const char* numpy_code(Element e);

/// Whether the element is a float8 bit pattern.
bool is_float8(Element e);

/// The value of float8 code `code` of `format` (exact: float32 holds every
/// float8 value); NaN for its NaN codes.
float float8_value(Element format, std::uint8_t code);

/// How a dtype is stored on disk.
struct DtypeInfo {
  /// The dtype's name in the index and run files ("float32", "bfloat16",
  /// "float8_e4m3fn", "uint16"): PyTorch's Python name.
  const char* name = "float32";
  /// What the bytes on disk hold.
  Element element = Element::F32;
  /// The LibTorch dtype of the bytes staged: float32 for bfloat16 (widened,
  /// exactly), uint8 for a float8 (its bits), the dtype itself otherwise.
  /// Only the sdk converts; the writers read `element`.
  c10::ScalarType stored = c10::ScalarType::Float;
  /// Whether `stored` is a view of the same bits (float8 as uint8) rather
  /// than the values converted (bfloat16 to float32).
  bool bits = false;
};

/// Describes `dtype`, or returns nullptr when tensortap cannot store it.
const DtypeInfo* dtype_info(c10::ScalarType dtype);

/// The LibTorch dtype of this name (c10::toString's, e.g. "UInt16"), when the
/// LibTorch at hand has it.
std::optional<c10::ScalarType> scalar_type_named(const std::string& torch_name);

/// The dtype's name as tensortap writes it ("float32"), or LibTorch's name
/// for dtypes it cannot store.
std::string dtype_name(c10::ScalarType dtype);

/// `t` as the tensor of `info.stored` whose bytes are stored: the same bits
/// for a float8, the values converted for bfloat16, `t` itself otherwise.
at::Tensor as_stored(const at::Tensor& t, const DtypeInfo& info);

/// "dtype float32, shape [3, 4], layout Strided, device cpu", for errors.
std::string describe_tensor(const at::Tensor& t);

}  // namespace tensortap::detail
