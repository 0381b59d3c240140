#include "writers/src/npy/format.h"

#include <algorithm>
#include <cstring>
#include <limits>

#include <fmt/format.h>

#include <tensortap/error.h>

#include "writers/src/check.h"
#include "writers/src/dtypes.h"
#include "writers/src/json.h"

namespace tensortap::detail {
namespace {

constexpr char kMagic[] = "\x93NUMPY";
constexpr size_t kMagicLen = 6;
constexpr size_t kAlign = 64;

bool little_endian_host() {
  const std::uint16_t one = 1;
  unsigned char first = 0;
  std::memcpy(&first, &one, 1);
  return first == 1;
}

// The shape as a Python tuple: "(2, 3)", "(5,)", "()".
std::size_t shape_tuple_room(c10::IntArrayRef shape) { return (kIntRoom + 2) * shape.size() + 3; }
char* put_shape_tuple(char* p, c10::IntArrayRef shape) {
  *p++ = '(';
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i) p = put(p, ", ");
    p = put_int(p, shape[i]);
  }
  if (shape.size() == 1) *p++ = ',';
  *p++ = ')';
  return p;
}

std::string shape_tuple(c10::IntArrayRef shape) {
  std::string s;
  append_put(s, shape_tuple_room(shape), [&](char* p) { return put_shape_tuple(p, shape); });
  return s;
}

// A recursive-descent reader for the one Python literal NumPy writes:
// a dict of str keys to str, bool, or a tuple of ints.
class DictParser {
 public:
  DictParser(std::string_view text, const std::string& what) : s_(text), what_(what) {}

  void parse(NpyHeader& h) {
    bool have_descr = false, have_order = false, have_shape = false;
    std::string descr;
    skip_ws();
    expect('{', "the header is not a Python dict");
    skip_ws();
    while (peek() != '}') {
      const std::string key = parse_string();
      skip_ws();
      expect(':', "expected ':' after a key");
      skip_ws();
      if (key == "descr") {
        descr = parse_string();
        have_descr = true;
      } else if (key == "fortran_order") {
        h.fortran_order = parse_bool();
        have_order = true;
      } else if (key == "shape") {
        h.shape = parse_tuple();
        have_shape = true;
      } else {
        fail(fmt::format("unexpected header key '{}'", key));
      }
      skip_ws();
      if (peek() == ',') {
        ++i_;
        skip_ws();
      } else if (peek() != '}') {
        fail("expected ',' or '}' in the header dict");
      }
    }
    if (!have_descr || !have_order || !have_shape)
      fail("the header dict lacks one of 'descr', 'fortran_order', 'shape'");
    set_dtype(descr, h);
  }

 private:
  [[noreturn]] void fail(const std::string& msg) const { detail::fail("{}: {}", what_, msg); }
  char peek() const { return i_ < s_.size() ? s_[i_] : '\0'; }
  void skip_ws() {
    while (i_ < s_.size() && (s_[i_] == ' ' || s_[i_] == '\t' || s_[i_] == '\n' || s_[i_] == '\r')) ++i_;
  }
  void expect(char c, const char* msg) {
    if (peek() != c) fail(msg);
    ++i_;
  }
  std::string parse_string() {
    const char q = peek();
    if (q != '\'' && q != '"') fail("expected a quoted string in the header");
    ++i_;
    const size_t begin = i_;
    while (i_ < s_.size() && s_[i_] != q) {
      if (s_[i_] == '\\') fail("escapes in header strings are not supported");
      ++i_;
    }
    if (i_ >= s_.size()) fail("unterminated string in the header");
    std::string out(s_.substr(begin, i_ - begin));
    ++i_;
    return out;
  }
  bool parse_bool() {
    if (s_.substr(i_, 4) == "True") {
      i_ += 4;
      return true;
    }
    if (s_.substr(i_, 5) == "False") {
      i_ += 5;
      return false;
    }
    fail("'fortran_order' is neither True nor False");
  }
  std::vector<std::int64_t> parse_tuple() {
    std::vector<std::int64_t> dims;
    expect('(', "'shape' is not a tuple");
    skip_ws();
    while (peek() != ')') {
      if (peek() == '-') fail("'shape' has a negative dimension");
      if (peek() < '0' || peek() > '9') fail("'shape' holds something that is not an integer");
      std::uint64_t v = 0;
      constexpr auto kMax = static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max());
      while (peek() >= '0' && peek() <= '9') {
        const auto d = static_cast<std::uint64_t>(peek() - '0');
        if (v > (kMax - d) / 10) fail("a 'shape' dimension overflows int64");
        v = v * 10 + d;
        ++i_;
      }
      if (peek() == 'L') ++i_;  // Python 2 longs
      dims.push_back(static_cast<std::int64_t>(v));
      if (dims.size() > 64) fail("'shape' has more than 64 dimensions");
      skip_ws();
      if (peek() == ',') {
        ++i_;
        skip_ws();
      } else if (peek() != ')') {
        fail("expected ',' or ')' in 'shape'");
      }
    }
    ++i_;
    return dims;
  }
  void set_dtype(const std::string& descr, NpyHeader& h) {
    if (descr.size() < 2) fail(fmt::format("unsupported dtype '{}'", descr));
    const char order = descr[0];
    const std::string code = descr.substr(1);
    const bool little = little_endian_host();
    if (order == '<')
      h.swap_bytes = !little;
    else if (order == '>')
      h.swap_bytes = little;
    else if (order == '|' || order == '=')
      h.swap_bytes = false;
    else
      fail(fmt::format("unsupported dtype '{}' (object and structured arrays cannot be read)", descr));
    using c10::ScalarType;
    static const std::pair<const char*, ScalarType> kCodes[] = {
        {"b1", ScalarType::Bool},         {"u1", ScalarType::Byte},          {"i1", ScalarType::Char},
        {"i2", ScalarType::Short},        {"i4", ScalarType::Int},           {"i8", ScalarType::Long},
        {"f2", ScalarType::Half},         {"f4", ScalarType::Float},         {"f8", ScalarType::Double},
        {"c8", ScalarType::ComplexFloat}, {"c16", ScalarType::ComplexDouble}};
    for (const auto& [c, t] : kCodes) {
      if (code == c) {
        h.dtype = t;
        if (c10::elementSize(t) == 1) h.swap_bytes = false;
        return;
      }
    }
    // LibTorch 2.3 and later have unsigned integers of 16 to 64 bits.
    static const std::pair<const char*, const char*> kUnsigned[] = {
        {"u2", "UInt16"}, {"u4", "UInt32"}, {"u8", "UInt64"}};
    for (const auto& [c, torch_name] : kUnsigned) {
      if (code != c) continue;
      if (const std::optional<ScalarType> t = scalar_type_named(torch_name)) {
        h.dtype = *t;
        return;
      }
      fail(fmt::format("unsupported dtype '{}' (this LibTorch has no {})", descr, torch_name));
    }
    fail(fmt::format("unsupported dtype '{}'", descr));
  }

  std::string_view s_;
  const std::string& what_;
  size_t i_ = 0;
};

}  // namespace

std::string npy_descr(Element stored) {
  const char order = element_size(stored) == 1 ? '|' : (little_endian_host() ? '<' : '>');
  std::string descr(1, order);
  descr += numpy_code(stored);
  return descr;
}

namespace {

// Sets `out` to the header around `descr`, the Python literal of the dtype
// (quoted when `quote`). Built in place, in memory `out` already has: a
// packed run writes one per record, on the writer thread's per-record path.
void header_into(std::string& out, std::string_view descr, bool quote, c10::IntArrayRef shape, std::size_t min_size) {
  // Version 1.0 stores the header length in 16 bits (a prefix of 10
  // bytes), 2.0 in 32 (12 bytes): the dict goes after the longer prefix,
  // and moves back by 2 bytes if version 1.0 holds it.
  constexpr size_t kPrefix2 = kMagicLen + 2 + 4;
  out.clear();
  append_put(out, kPrefix2 + 64 + descr.size() + shape_tuple_room(shape), [&](char* p) {
    p += kPrefix2;
    p = put(p, "{'descr': ");
    if (quote) *p++ = '\'';
    p = put(p, descr);
    if (quote) *p++ = '\'';
    p = put(p, ", 'fortran_order': False, 'shape': ");
    p = put_shape_tuple(p, shape);
    return put(p, ", }");
  });
  const size_t dict = out.size() - kPrefix2;
  for (int version = 1; version <= 2; ++version) {
    const size_t len_bytes = version == 1 ? 2 : 4;
    const size_t prefix = kMagicLen + 2 + len_bytes;
    size_t total = std::max(prefix + dict + 1, min_size);  // +1 for the closing '\n'
    total = (total + kAlign - 1) / kAlign * kAlign;
    const size_t header_len = total - prefix;
    if (version == 1 && header_len > 0xFFFF) continue;
    if (prefix != kPrefix2) out.erase(0, kPrefix2 - prefix);
    std::memcpy(&out[0], kMagic, kMagicLen);
    out[kMagicLen] = static_cast<char>(version);
    out[kMagicLen + 1] = 0;
    for (size_t b = 0; b < len_bytes; ++b) out[8 + b] = static_cast<char>((header_len >> (8 * b)) & 0xFF);
    // Spaces to the length, then '\n'.
    out.resize(total, ' ');
    out.back() = '\n';
    return;
  }
  fail("npy header too long");
}

}  // namespace

void npy_header_into(std::string& out, Element stored, c10::IntArrayRef shape) {
  header_into(out, npy_descr(stored), /*quote=*/true, shape, 0);
}

std::string npy_header(std::string_view descr, c10::IntArrayRef shape, std::size_t min_size) {
  std::string out;
  header_into(out, descr, /*quote=*/true, shape, min_size);
  return out;
}

std::string npy_header(const std::vector<NpyField>& fields, c10::IntArrayRef shape, std::size_t min_size) {
  std::string descr = "[";
  for (const NpyField& f : fields) {
    if (descr.size() > 1) descr += ", ";
    descr += fmt::format("('{}', '{}')", f.name, f.descr);
  }
  descr += "]";
  std::string out;
  header_into(out, descr, /*quote=*/false, shape, min_size);
  return out;
}

std::uint64_t npy_header_end(std::string_view prefix, std::uint64_t file_size, const std::string& what) {
  if (prefix.size() < kMagicLen + 2 || std::memcmp(prefix.data(), kMagic, kMagicLen) != 0)
    fail("{}: not a .npy file (bad magic)", what);
  const auto major = static_cast<unsigned char>(prefix[6]);
  if (major < 1 || major > 3)
    fail("{}: unknown .npy format version {}.{}", what, major, static_cast<unsigned char>(prefix[7]));
  const size_t len_bytes = major == 1 ? 2 : 4;
  const size_t start = kMagicLen + 2 + len_bytes;
  if (prefix.size() < start) fail("{}: truncated .npy header", what);
  std::uint64_t header_len = 0;
  for (size_t b = 0; b < len_bytes; ++b)
    header_len |= static_cast<std::uint64_t>(static_cast<unsigned char>(prefix[8 + b])) << (8 * b);
  if (start + header_len > file_size)
    fail("{}: header length {} runs past the end of the file ({} bytes)", what, header_len, file_size);
  return start + header_len;
}

NpyHeader parse_npy_header(std::string_view prefix, std::uint64_t file_size, const std::string& what) {
  NpyHeader h;
  const std::uint64_t end = npy_header_end(prefix, file_size, what);
  if (end > prefix.size()) fail("{}: truncated .npy header", what);
  h.major_version = static_cast<unsigned char>(prefix[6]);
  const size_t start = h.major_version == 1 ? 10 : 12;
  const size_t header_len = end - start;
  DictParser(prefix.substr(start, header_len), what).parse(h);
  h.data_offset = start + header_len;

  // The product of the non-zero dimensions bounds the strides a tensor of
  // this shape has, even when a zero makes it empty: it must fit too.
  std::uint64_t count = 1, span = 1;
  for (std::int64_t d : h.shape) {
    const auto ud = static_cast<std::uint64_t>(d);
    if (ud != 0 && span > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max()) / ud)
      fail("{}: shape {} overflows", what, shape_tuple(h.shape));
    if (ud != 0) span *= ud;
    count *= ud;
  }
  const std::uint64_t elem = c10::elementSize(h.dtype);
  if (count > std::numeric_limits<std::uint64_t>::max() / elem ||
      count * elem > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max()))
    fail("{}: shape {} overflows", what, shape_tuple(h.shape));
  h.data_bytes = count * elem;
  if (h.data_offset + h.data_bytes > file_size)
    fail("{}: shape {} needs {} bytes of data but the file holds {}", what, shape_tuple(h.shape),
                            h.data_bytes, file_size - h.data_offset);
  return h;
}

}  // namespace tensortap::detail
