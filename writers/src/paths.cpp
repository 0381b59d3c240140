#include "writers/src/paths.h"

#include <fmt/format.h>

namespace tensortap::detail {
namespace {

bool is_safe(unsigned char c) {
  if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9')) return true;
  switch (c) {
    case '.':
    case '_':
    case '-':
    case '#':
    case '+':
    case '=':
    case '@':
    case ',': return true;
    default: return false;
  }
}

// FNV-1a: stable across runs and platforms, which std::hash is not.
std::uint64_t fnv1a(std::string_view s) {
  std::uint64_t h = 1469598103934665603ull;
  for (unsigned char c : s) {
    h ^= c;
    h *= 1099511628211ull;
  }
  return h;
}

constexpr size_t kMaxEncoded = 200;

}  // namespace

std::string encode_name(std::string_view name) {
  std::string out;
  out.reserve(name.size());
  for (size_t i = 0; i < name.size(); ++i) {
    const auto c = static_cast<unsigned char>(name[i]);
    if (is_safe(c) && !(i == 0 && c == '.')) {
      out.push_back(static_cast<char>(c));
    } else {
      out += fmt::format("%{:02X}", c);
    }
  }
  if (out.empty()) out = "%00empty";
  if (out.size() > kMaxEncoded) {
    size_t cut = kMaxEncoded - 17;
    // '%' only ever starts a three-byte escape: do not cut one in half.
    if (out[cut - 1] == '%')
      cut -= 1;
    else if (out[cut - 2] == '%')
      cut -= 2;
    out = fmt::format("{}~{:016x}", out.substr(0, cut), fnv1a(name));
  }
  return out;
}

std::string step_stem(std::int64_t step) { return fmt::format("{:08d}", step); }

}  // namespace tensortap::detail
