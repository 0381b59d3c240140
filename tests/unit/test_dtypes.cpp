// How each dtype is stored (writers/src/dtypes.*), and the dtypes LibTorch
// 2.x adds (issue 17, item 15). Their files, read by the Python reader:
// dtype_runs.cpp and test_float8.py.
#include <cmath>
#include <cstring>
#include <limits>
#include <string>

#include <ATen/ATen.h>
#include <torch/version.h>

#include <tensortap/tensortap.h>

#include "tests/support/helpers.h"
#include "writers/src/dtypes.h"
#include "writers/src/lines_file.h"
#include "writers/src/writer.h"

using tensortap::detail::dtype_info;
using tensortap::detail::DtypeInfo;
using tensortap::detail::Element;
using tensortap::detail::float8_value;

TEST_CASE("every dtype LibTorch 1.13 has is stored as before", "[writers][dtypes]") {
  struct Want {
    c10::ScalarType dtype;
    const char* name;
    Element element;
    c10::ScalarType stored;
  };
  using c10::ScalarType;
  const Want wants[] = {
      {ScalarType::Bool, "bool", Element::Bool, ScalarType::Bool},
      {ScalarType::Byte, "uint8", Element::U8, ScalarType::Byte},
      {ScalarType::Char, "int8", Element::I8, ScalarType::Char},
      {ScalarType::Short, "int16", Element::I16, ScalarType::Short},
      {ScalarType::Int, "int32", Element::I32, ScalarType::Int},
      {ScalarType::Long, "int64", Element::I64, ScalarType::Long},
      {ScalarType::Half, "float16", Element::F16, ScalarType::Half},
      {ScalarType::Float, "float32", Element::F32, ScalarType::Float},
      {ScalarType::Double, "float64", Element::F64, ScalarType::Double},
      {ScalarType::ComplexFloat, "complex64", Element::C64, ScalarType::ComplexFloat},
      {ScalarType::ComplexDouble, "complex128", Element::C128, ScalarType::ComplexDouble},
      {ScalarType::BFloat16, "bfloat16", Element::F32, ScalarType::Float},
  };
  for (const Want& w : wants) {
    CAPTURE(w.name);
    const DtypeInfo* info = dtype_info(w.dtype);
    REQUIRE(info != nullptr);
    REQUIRE(std::string(info->name) == w.name);
    REQUIRE(info->element == w.element);
    REQUIRE(info->stored == w.stored);
    REQUIRE(!info->bits);
  }
  // What NumPy cannot hold is refused, by its LibTorch name.
  for (auto t : {ScalarType::ComplexHalf, ScalarType::QInt8, ScalarType::Undefined}) {
    REQUIRE(dtype_info(t) == nullptr);
    REQUIRE(tensortap::detail::dtype_name(t) == c10::toString(t));
  }
}

TEST_CASE("a capture of a dtype tensortap cannot store names the tensor and the dtype", "[writers][dtypes]") {
  tt_test::TempDir dir;
  tensortap::Recorder rec{tensortap::Options(dir.path)};
  rec.step(0);
  const std::string error =
      tt_test::error_of([&] { rec.capture("halfc", at::zeros({2}, at::TensorOptions().dtype(at::kComplexHalf))); });
  REQUIRE_THAT(error,
               Catch::Contains("'halfc'") && Catch::Contains("ComplexHalf") && Catch::Contains("NumPy has no dtype"));
  rec.close();
}

TEST_CASE("index lines name the dtype as captured, elements say what the bytes hold", "[writers][dtypes]") {
  tensortap::detail::RecordDesc d;
  d.name = "x";
  d.shape = {2};
  d.dtype = DtypeInfo{"uint16", Element::U16, c10::ScalarType::Undefined, false};
  std::string line;
  tensortap::detail::append_index_line(line, d, "\"file\":\"f.npy\"");
  REQUIRE_THAT(line, Catch::Contains("\"dtype\":\"uint16\""));
  REQUIRE(tensortap::detail::element_size(Element::U64) == 8);
  REQUIRE(std::string(tensortap::detail::numpy_code(Element::U32)) == "u4");
  // A float8 is one byte on disk, NumPy's uint8.
  REQUIRE(tensortap::detail::element_size(Element::F8E5M2) == 1);
  REQUIRE(std::string(tensortap::detail::numpy_code(Element::F8E4M3FN)) == "u1");
}

TEST_CASE("float8 codes decode as the OCP and PyTorch definitions say", "[writers][dtypes]") {
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  struct Code {
    Element f;
    std::uint8_t code;
    float value;
  };
  const Code codes[] = {
      // e4m3fn: bias 7, no infinities, NaN = S.1111.111.
      {Element::F8E4M3FN, 0x7E, 448},
      {Element::F8E4M3FN, 0x08, 0.015625f},     // 2^-6, smallest normal
      {Element::F8E4M3FN, 0x01, 0.001953125f},  // 2^-9
      {Element::F8E4M3FN, 0x78, 256},
      {Element::F8E4M3FN, 0x7F, nan},
      {Element::F8E4M3FN, 0xFE, -448},
      {Element::F8E4M3FN, 0x38, 1},
      // e5m2: bias 15, IEEE-like.
      {Element::F8E5M2, 0x7B, 57344},
      {Element::F8E5M2, 0x7C, inf},
      {Element::F8E5M2, 0xFC, -inf},
      {Element::F8E5M2, 0x7D, nan},
      {Element::F8E5M2, 0x01, 1.52587890625e-05f},  // 2^-16
      {Element::F8E5M2, 0x3C, 1},
      // fnuz: bias 8 / 16, 0x80 the one NaN, no infinities.
      {Element::F8E4M3FNUZ, 0x80, nan},
      {Element::F8E4M3FNUZ, 0x7F, 240},
      {Element::F8E4M3FNUZ, 0xFF, -240},
      {Element::F8E4M3FNUZ, 0x40, 1},
      {Element::F8E5M2FNUZ, 0x80, nan},
      {Element::F8E5M2FNUZ, 0x7F, 57344},
      {Element::F8E5M2FNUZ, 0x40, 1},
      // e8m0fnu: 2^(code - 127), 0xFF NaN.
      {Element::F8E8M0FNU, 127, 1},
      {Element::F8E8M0FNU, 0, std::ldexp(1.0f, -127)},
      {Element::F8E8M0FNU, 254, std::ldexp(1.0f, 127)},
      {Element::F8E8M0FNU, 0xFF, nan},
  };
  for (const Code& c : codes) {
    CAPTURE(static_cast<int>(c.f), static_cast<int>(c.code));
    const float got = float8_value(c.f, c.code);
    if (std::isnan(c.value))
      REQUIRE(std::isnan(got));
    else
      REQUIRE(got == c.value);
  }
  // The signed formats' 0x80 is negative zero, except fnuz's (NaN).
  REQUIRE(std::signbit(float8_value(Element::F8E4M3FN, 0x80)));
  REQUIRE(float8_value(Element::F8E4M3FN, 0x80) == 0);
}

#if TORCH_VERSION_MAJOR >= 2
// LibTorch 2.x: the real tensors, by LibTorch's own names (each arrived in
// another release, so those this one lacks are passed over).
TEST_CASE("LibTorch 2.x float8 decodes as LibTorch converts, on every code", "[writers][dtypes]") {
  for (auto [torch_name, f] : {std::pair{"Float8_e4m3fn", Element::F8E4M3FN},
                               {"Float8_e5m2", Element::F8E5M2},
                               {"Float8_e4m3fnuz", Element::F8E4M3FNUZ},
                               {"Float8_e5m2fnuz", Element::F8E5M2FNUZ},
                               {"Float8_e8m0fnu", Element::F8E8M0FNU}}) {
    const auto dtype = tensortap::detail::scalar_type_named(torch_name);
    if (!dtype) continue;
    CAPTURE(torch_name);
    REQUIRE(dtype_info(*dtype)->element == f);
    REQUIRE(dtype_info(*dtype)->bits);
    const at::Tensor codes = at::arange(256, at::kInt).to(at::kByte);
    const at::Tensor want = codes.view(*dtype).to(at::kFloat);
    for (int c = 0; c < 256; ++c) {
      const float w = want[c].item<float>(), got = float8_value(f, static_cast<std::uint8_t>(c));
      CAPTURE(c, w, got);
      REQUIRE(((std::isnan(w) && std::isnan(got)) || w == got));
      REQUIRE(std::signbit(w) == std::signbit(got));
    }
  }
}

TEST_CASE("LibTorch 2.x uint16/32/64 and float8 captures are stored exactly", "[writers][dtypes]") {
  for (const char* torch_name : {"UInt16", "UInt32", "UInt64", "Float8_e4m3fn", "Float8_e5m2", "Float8_e4m3fnuz",
                                 "Float8_e5m2fnuz", "Float8_e8m0fnu"}) {
    const auto dtype = tensortap::detail::scalar_type_named(torch_name);
    if (!dtype) continue;
    CAPTURE(torch_name);
    const DtypeInfo& info = *dtype_info(*dtype);
    // Every byte pattern, through a strided view (the copy path, not memcpy).
    const at::Tensor bytes = at::arange(512 * c10::elementSize(*dtype), at::kLong).remainder(251).to(at::kByte);
    const at::Tensor t = bytes.view(*dtype).view({-1, 2}).select(1, 0);
    for (auto format : {tensortap::Format::Npy, tensortap::Format::Packed}) {
      tt_test::TempDir dir;
      tensortap::Recorder rec{tensortap::Options(dir.path).format(format)};
      rec.step(0);
      rec.capture("x", t);
      rec.close();
      const auto lines = tt_test::index_lines_with(dir.path, "\"name\":\"x\"");
      REQUIRE(lines.size() == 1);
      REQUIRE_THAT(lines[0], Catch::Contains(std::string("\"dtype\":\"") + info.name + "\""));
      if (format != tensortap::Format::Npy) continue;
      const at::Tensor got = tensortap::load_npy(dir / "npy/tensor/x/00000000.npy");
      // Unsigned integers come back as themselves, a float8 as its bytes.
      const at::Tensor want = info.bits ? t.contiguous().view(at::kByte) : t.contiguous();
      REQUIRE(got.scalar_type() == want.scalar_type());
      REQUIRE(got.sizes() == want.sizes());
      REQUIRE(std::memcmp(got.data_ptr(), want.data_ptr(), want.nbytes()) == 0);
    }
  }
}
#endif
