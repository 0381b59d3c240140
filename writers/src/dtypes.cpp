#include "writers/src/dtypes.h"

#include <array>
#include <cmath>
#include <cstring>
#include <limits>
#include <sstream>

namespace tensortap::detail {
namespace {

struct ElementInfo {
  std::size_t size;
  const char* numpy;
};

ElementInfo element_info(Element e) {
  switch (e) {
    case Element::Bool: return {1, "b1"};
    case Element::U8: return {1, "u1"};
    case Element::I8: return {1, "i1"};
    case Element::I16: return {2, "i2"};
    case Element::I32: return {4, "i4"};
    case Element::I64: return {8, "i8"};
    case Element::U16: return {2, "u2"};
    case Element::U32: return {4, "u4"};
    case Element::U64: return {8, "u8"};
    case Element::F16: return {2, "f2"};
    case Element::F32: return {4, "f4"};
    case Element::F64: return {8, "f8"};
    case Element::C64: return {8, "c8"};
    case Element::C128: return {16, "c16"};
    case Element::F8E4M3FN:
    case Element::F8E5M2:
    case Element::F8E4M3FNUZ:
    case Element::F8E5M2FNUZ:
    case Element::F8E8M0FNU: return {1, "u1"};
  }
  return {1, "u1"};
}

// How each LibTorch dtype tensortap stores is kept, by LibTorch's own name
// for it (c10::toString). Matching names rather than enumerators lets one
// source build against every LibTorch: float8 came in 2.1 and 2.2 (e8m0fnu
// later), uint16/32/64 in 2.3, and a version test would have to know each.
enum class Keep : std::uint8_t { Same, Widen, Bits };
struct Known {
  const char* torch_name;
  const char* name;
  Element element;
  Keep keep;
};
constexpr Known kKnown[] = {
    {"Bool", "bool", Element::Bool, Keep::Same},
    {"Byte", "uint8", Element::U8, Keep::Same},
    {"Char", "int8", Element::I8, Keep::Same},
    {"Short", "int16", Element::I16, Keep::Same},
    {"Int", "int32", Element::I32, Keep::Same},
    {"Long", "int64", Element::I64, Keep::Same},
    {"UInt16", "uint16", Element::U16, Keep::Same},
    {"UInt32", "uint32", Element::U32, Keep::Same},
    {"UInt64", "uint64", Element::U64, Keep::Same},
    {"Half", "float16", Element::F16, Keep::Same},
    {"Float", "float32", Element::F32, Keep::Same},
    {"Double", "float64", Element::F64, Keep::Same},
    {"ComplexFloat", "complex64", Element::C64, Keep::Same},
    {"ComplexDouble", "complex128", Element::C128, Keep::Same},
    // NumPy has no bfloat16; float32 holds every bfloat16 value exactly.
    {"BFloat16", "bfloat16", Element::F32, Keep::Widen},
    // Nor float8: its bytes are kept as they are, the reader decodes them.
    {"Float8_e4m3fn", "float8_e4m3fn", Element::F8E4M3FN, Keep::Bits},
    {"Float8_e5m2", "float8_e5m2", Element::F8E5M2, Keep::Bits},
    {"Float8_e4m3fnuz", "float8_e4m3fnuz", Element::F8E4M3FNUZ, Keep::Bits},
    {"Float8_e5m2fnuz", "float8_e5m2fnuz", Element::F8E5M2FNUZ, Keep::Bits},
    {"Float8_e8m0fnu", "float8_e8m0fnu", Element::F8E8M0FNU, Keep::Bits},
};

constexpr int kNumScalarTypes = static_cast<int>(c10::ScalarType::NumOptions);

struct Table {
  std::array<DtypeInfo, kNumScalarTypes> info{};
  std::array<bool, kNumScalarTypes> known{};
  Table() {
    for (int i = 0; i < kNumScalarTypes; ++i) {
      const auto t = static_cast<c10::ScalarType>(i);
      const char* torch_name = c10::toString(t);
      for (const Known& k : kKnown) {
        if (std::strcmp(k.torch_name, torch_name) != 0) continue;
        const c10::ScalarType stored = k.keep == Keep::Same    ? t
                                       : k.keep == Keep::Widen ? c10::ScalarType::Float
                                                               : c10::ScalarType::Byte;
        info[i] = DtypeInfo{k.name, k.element, stored, k.keep == Keep::Bits};
        known[i] = true;
      }
    }
  }
};

const Table& table() {
  static const Table t;
  return t;
}

}  // namespace

std::size_t element_size(Element e) { return element_info(e).size; }

const char* numpy_code(Element e) { return element_info(e).numpy; }

bool is_float8(Element e) {
  switch (e) {
    case Element::F8E4M3FN:
    case Element::F8E5M2:
    case Element::F8E4M3FNUZ:
    case Element::F8E5M2FNUZ:
    case Element::F8E8M0FNU: return true;
    default: return false;
  }
}

float float8_value(Element format, std::uint8_t code) {
  constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
  // e8m0fnu: an exponent alone (bias 127), no sign, no zero; 0xFF is NaN.
  if (format == Element::F8E8M0FNU) return code == 0xFF ? kNaN : std::ldexp(1.0f, int{code} - 127);
  int exp_bits = 4, bias = 7;
  if (format == Element::F8E5M2) exp_bits = 5, bias = 15;
  if (format == Element::F8E4M3FNUZ) bias = 8;
  if (format == Element::F8E5M2FNUZ) exp_bits = 5, bias = 16;
  const int man_bits = 7 - exp_bits;
  const bool fnuz = format == Element::F8E4M3FNUZ || format == Element::F8E5M2FNUZ;
  // fnuz: the code of negative zero is the one NaN; no infinities.
  if (fnuz && code == 0x80) return kNaN;
  const int exp = (code >> man_bits) & ((1 << exp_bits) - 1);
  const int man = code & ((1 << man_bits) - 1);
  const bool negative = (code & 0x80) != 0;
  // A NaN keeps its sign bit, as LibTorch's conversion does.
  if (format == Element::F8E4M3FN && exp == 15 && man == 7) return negative ? -kNaN : kNaN;  // S.1111.111
  if (format == Element::F8E5M2 && exp == 31) {                                              // IEEE-like
    if (man != 0) return negative ? -kNaN : kNaN;
    return negative ? -std::numeric_limits<float>::infinity() : std::numeric_limits<float>::infinity();
  }
  const float magnitude = exp == 0 ? std::ldexp(static_cast<float>(man), 1 - bias - man_bits)
                                   : std::ldexp(static_cast<float>((1 << man_bits) + man), exp - bias - man_bits);
  return negative ? -magnitude : magnitude;
}

const DtypeInfo* dtype_info(c10::ScalarType dtype) {
  const int i = static_cast<int>(dtype);
  if (i < 0 || i >= kNumScalarTypes) return nullptr;
  const Table& t = table();
  return t.known[i] ? &t.info[i] : nullptr;
}

std::optional<c10::ScalarType> scalar_type_named(const std::string& torch_name) {
  for (int i = 0; i < kNumScalarTypes; ++i) {
    const auto t = static_cast<c10::ScalarType>(i);
    if (torch_name == c10::toString(t)) return t;
  }
  return std::nullopt;
}

std::string dtype_name(c10::ScalarType dtype) {
  const DtypeInfo* info = dtype_info(dtype);
  return info != nullptr ? info->name : c10::toString(dtype);
}

at::Tensor as_stored(const at::Tensor& t, const DtypeInfo& info) {
  if (t.scalar_type() == info.stored) return t;
  return info.bits ? t.view(info.stored) : t.to(info.stored);
}

std::string describe_tensor(const at::Tensor& t) {
  if (!t.defined()) return "undefined tensor";
  std::ostringstream os;
  os << "dtype " << dtype_name(t.scalar_type());
  // A nested tensor has no single shape: sizes() raises LibTorch's
  // "Internal error", which would replace the message naming the tensor.
  if (t.is_nested())
    os << ", nested (" << t.dim() << " dimensions)";
  else
    os << ", shape " << t.sizes();
  os << ", layout " << t.layout() << ", device " << t.device();
  return os.str();
}

}  // namespace tensortap::detail
