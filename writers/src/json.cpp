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

namespace {

void put_utf8(std::string& out, unsigned cp) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

// The 4 hex digits of a \u escape at s[i]; false if they are not.
bool hex4(std::string_view s, std::size_t& i, unsigned& v) {
  if (i + 4 > s.size()) return false;
  v = 0;
  for (int k = 0; k < 4; ++k) {
    const char c = s[i++];
    v <<= 4;
    if (c >= '0' && c <= '9')
      v |= static_cast<unsigned>(c - '0');
    else if (c >= 'a' && c <= 'f')
      v |= static_cast<unsigned>(c - 'a' + 10);
    else if (c >= 'A' && c <= 'F')
      v |= static_cast<unsigned>(c - 'A' + 10);
    else
      return false;
  }
  return true;
}

}  // namespace

std::string read_json_string(std::string_view s, std::size_t& i, std::string& out, bool utf8, bool surrogateescape) {
  if (i >= s.size() || s[i] != '"') return "expected a string";
  ++i;
  for (;;) {
    if (i >= s.size()) return "a string that does not end";
    const char c = s[i];
    if (c == '"') {
      ++i;
      return {};
    }
    if (static_cast<unsigned char>(c) < 0x20) return "a control character in a string";
    if (c != '\\') {
      const std::size_t n = utf8 ? utf8_sequence_length(s, i) : 1;
      if (n == 0) return "a string that is not UTF-8";
      out.append(s.substr(i, n));
      i += n;
      continue;
    }
    if (++i >= s.size()) return "a string that does not end";
    const char e = s[i++];
    switch (e) {
      case '"': out += '"'; break;
      case '\\': out += '\\'; break;
      case '/': out += '/'; break;
      case 'b': out += '\b'; break;
      case 'f': out += '\f'; break;
      case 'n': out += '\n'; break;
      case 'r': out += '\r'; break;
      case 't': out += '\t'; break;
      case 'u': {
        unsigned cp = 0;
        if (!hex4(s, i, cp)) return "a \\u escape that is not 4 hexadecimal digits";
        if (surrogateescape && cp >= 0xDC80 && cp <= 0xDCFF) {
          out += static_cast<char>(cp - 0xDC00);
          break;
        }
        if (cp >= 0xD800 && cp <= 0xDBFF) {
          unsigned lo = 0;
          if (i + 2 > s.size() || s[i] != '\\' || s[i + 1] != 'u') return "a lone surrogate in a \\u escape";
          i += 2;
          if (!hex4(s, i, lo)) return "a \\u escape that is not 4 hexadecimal digits";
          if (lo < 0xDC00 || lo > 0xDFFF) return "a lone surrogate in a \\u escape";
          cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
        } else if (cp >= 0xDC00 && cp <= 0xDFFF) {
          return "a lone surrogate in a \\u escape";
        }
        put_utf8(out, cp);
        break;
      }
      default: return std::string("an escape '\\") + e + "' JSON does not have";
    }
  }
}

}  // namespace tensortap::detail
