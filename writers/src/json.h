#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

#include <c10/util/ArrayRef.h>

namespace tensortap::detail {

// Lines and headers the writer thread builds per record are written through
// a pointer into memory reserved for all of it (`append_put`): a
// `std::string` append per piece cost more than the piece (bench/README.md).
// Each `put_*` writes at `p`, which has the room its `*_room` says, and
// returns the end of what it wrote.

/// Room for any int64 in decimal ("-9223372036854775808").
constexpr std::size_t kIntRoom = 20;
char* put_int(char* p, std::int64_t v);

/// Copies `s`.
inline char* put(char* p, std::string_view s) {
  std::memcpy(p, s.data(), s.size());
  return p + s.size();
}

/// Room for `put_json_string(s)`: every byte may become a 6-byte escape.
inline std::size_t json_string_room(std::string_view s) { return 6 * s.size() + 2; }
/// `append_json_string()` at `p`.
char* put_json_string(char* p, std::string_view s);

/// Room for `put_json_ints(values)`.
inline std::size_t json_ints_room(c10::IntArrayRef values) { return (kIntRoom + 1) * values.size() + 2; }
/// `append_json_ints()` at `p`.
char* put_json_ints(char* p, c10::IntArrayRef values);

/// Appends what `put(char*) -> char*` writes in at most `room` bytes.
template <typename Put>
void append_put(std::string& out, std::size_t room, Put&& put) {
  const std::size_t old = out.size();
  out.resize(old + room);
  char* const begin = &out[0];
  out.resize(static_cast<std::size_t>(put(begin + old) - begin));
}

/// Appends `v` in decimal.
void append_int(std::string& out, std::int64_t v);

/// Length of the well-formed UTF-8 sequence starting at s[i] (no overlong
/// forms, surrogates or values past U+10FFFF), or 0 if it is not one.
std::size_t utf8_sequence_length(std::string_view s, std::size_t i);

/// Reads the JSON string whose opening quote is at s[i], strictly: the
/// escapes RFC 8259 has, a surrogate pair joined, a lone surrogate and a
/// control character refused. `utf8`: the bytes outside escapes must be
/// UTF-8. `surrogateescape`: \udc80-\udcff is the byte 0x80-0xff (how
/// append_json_string escapes a byte that is not UTF-8). On success appends
/// the string's bytes to `out`, moves `i` past the closing quote and
/// returns ""; otherwise returns what is wrong, `i` at it, for the caller
/// to say in its own way (the index's reader, a control request's).
std::string read_json_string(std::string_view s, std::size_t& i, std::string& out, bool utf8, bool surrogateescape);

/// Appends `s` to `out` as a quoted JSON string. Valid UTF-8 passes through;
/// control characters are escaped, and each byte XX that is not valid UTF-8
/// becomes \udcXX (Python's surrogateescape) so the line stays valid JSON
/// whatever a name holds.
void append_json_string(std::string& out, std::string_view s);

/// Appends `[a,b,c]`.
void append_json_ints(std::string& out, c10::IntArrayRef values);

}  // namespace tensortap::detail
