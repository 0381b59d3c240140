#include "writers/src/json.h"

#include <charconv>
#include <cstring>

namespace tensortap::detail {

size_t utf8_sequence_length(std::string_view s, size_t i) {
  const auto c = static_cast<unsigned char>(s[i]);
  size_t n = 0;
  std::uint32_t cp = 0;
  if (c < 0x80) return 1;
  if ((c & 0xE0) == 0xC0) {
    n = 2;
    cp = c & 0x1F;
  } else if ((c & 0xF0) == 0xE0) {
    n = 3;
    cp = c & 0x0F;
  } else if ((c & 0xF8) == 0xF0) {
    n = 4;
    cp = c & 0x07;
  } else
    return 0;
  if (i + n > s.size()) return 0;
  for (size_t k = 1; k < n; ++k) {
    const auto cc = static_cast<unsigned char>(s[i + k]);
    if ((cc & 0xC0) != 0x80) return 0;
    cp = (cp << 6) | (cc & 0x3F);
  }
  // Overlong forms, surrogates and values past U+10FFFF are not valid UTF-8.
  static const std::uint32_t kMin[] = {0, 0, 0x80, 0x800, 0x10000};
  if (cp < kMin[n] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return 0;
  return n;
}

char* put_int(char* p, std::int64_t v) { return std::to_chars(p, p + kIntRoom, v).ptr; }

char* put_json_string(char* p, std::string_view s) {
  static const char kHex[] = "0123456789abcdef";
  const auto put_u = [&p](unsigned v) {
    const char u[6] = {'\\', 'u', kHex[(v >> 12) & 15], kHex[(v >> 8) & 15], kHex[(v >> 4) & 15], kHex[v & 15]};
    std::memcpy(p, u, 6);
    p += 6;
  };
  *p++ = '"';
  for (size_t i = 0; i < s.size();) {
    // Runs of printable ASCII that need no escape go out in one copy: an
    // index line holds two strings per record, and this is the writer
    // thread's per-record path.
    size_t run = i;
    while (run < s.size() && s[run] >= 0x20 && s[run] < 0x7F && s[run] != '"' && s[run] != '\\') ++run;
    if (run > i) {
      p = put(p, s.substr(i, run - i));
      i = run;
      continue;
    }
    const auto c = static_cast<unsigned char>(s[i]);
    const char* escape = c == '"'    ? "\\\""
                         : c == '\\' ? "\\\\"
                         : c == '\n' ? "\\n"
                         : c == '\r' ? "\\r"
                         : c == '\t' ? "\\t"
                                     : nullptr;
    if (escape != nullptr) {
      p = put(p, std::string_view(escape, 2));
      ++i;
      continue;
    }
    if (c < 0x20 || c == 0x7F) {
      put_u(c);
      ++i;
      continue;
    }
    const size_t n = utf8_sequence_length(s, i);
    if (n == 0) {
      // A byte that is not UTF-8 becomes a lone low surrogate, U+DC80 to
      // U+DCFF, as Python's "surrogateescape" has it: distinct from every
      // real character (0xC3 alone is not "\u00c3", which is Ã), and
      // name.encode("utf-8", "surrogateescape") gives the bytes back.
      put_u(0xDC00 + c);
      ++i;
    } else {
      p = put(p, s.substr(i, n));
      i += n;
    }
  }
  *p++ = '"';
  return p;
}

char* put_json_ints(char* p, c10::IntArrayRef values) {
  *p++ = '[';
  for (size_t i = 0; i < values.size(); ++i) {
    if (i) *p++ = ',';
    p = put_int(p, values[i]);
  }
  *p++ = ']';
  return p;
}

void append_int(std::string& out, std::int64_t v) {
  char digits[kIntRoom];
  out.append(digits, put_int(digits, v));
}

void append_json_string(std::string& out, std::string_view s) {
  append_put(out, json_string_room(s), [&](char* p) { return put_json_string(p, s); });
}

void append_json_ints(std::string& out, c10::IntArrayRef values) {
  append_put(out, json_ints_room(values), [&](char* p) { return put_json_ints(p, values); });
}

}  // namespace tensortap::detail
