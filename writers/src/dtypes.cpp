#include "writers/src/dtypes.h"

#include <sstream>

namespace tensortap::detail {

const DtypeInfo* dtype_info(c10::ScalarType dtype) {
  using c10::ScalarType;
  static const DtypeInfo kBool{"bool", ScalarType::Bool, "b1"};
  static const DtypeInfo kU8{"uint8", ScalarType::Byte, "u1"};
  static const DtypeInfo kI8{"int8", ScalarType::Char, "i1"};
  static const DtypeInfo kI16{"int16", ScalarType::Short, "i2"};
  static const DtypeInfo kI32{"int32", ScalarType::Int, "i4"};
  static const DtypeInfo kI64{"int64", ScalarType::Long, "i8"};
  static const DtypeInfo kF16{"float16", ScalarType::Half, "f2"};
  static const DtypeInfo kF32{"float32", ScalarType::Float, "f4"};
  static const DtypeInfo kF64{"float64", ScalarType::Double, "f8"};
  static const DtypeInfo kC64{"complex64", ScalarType::ComplexFloat, "c8"};
  static const DtypeInfo kC128{"complex128", ScalarType::ComplexDouble, "c16"};
  // NumPy has no bfloat16; float32 holds every bfloat16 value exactly.
  static const DtypeInfo kBF16{"bfloat16", ScalarType::Float, "f4"};
  switch (dtype) {
    case ScalarType::Bool: return &kBool;
    case ScalarType::Byte: return &kU8;
    case ScalarType::Char: return &kI8;
    case ScalarType::Short: return &kI16;
    case ScalarType::Int: return &kI32;
    case ScalarType::Long: return &kI64;
    case ScalarType::Half: return &kF16;
    case ScalarType::Float: return &kF32;
    case ScalarType::Double: return &kF64;
    case ScalarType::ComplexFloat: return &kC64;
    case ScalarType::ComplexDouble: return &kC128;
    case ScalarType::BFloat16: return &kBF16;
    default: return nullptr;
  }
}

std::string dtype_name(c10::ScalarType dtype) {
  const DtypeInfo* info = dtype_info(dtype);
  return info != nullptr ? info->name : c10::toString(dtype);
}

std::string describe_tensor(const at::Tensor& t) {
  if (!t.defined()) return "undefined tensor";
  std::ostringstream os;
  os << "dtype " << dtype_name(t.scalar_type()) << ", shape " << t.sizes() << ", layout " << t.layout() << ", device "
     << t.device();
  return os.str();
}

}  // namespace tensortap::detail
