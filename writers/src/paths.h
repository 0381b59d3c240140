#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace tensortap::detail {

/// Turns a record name into one safe path component: ASCII letters, digits
/// and `._-#+=@,` pass; every other byte (`/`, `\`, NUL, spaces, `%`, UTF-8,
/// control characters) becomes `%XX`, and a leading `.` becomes `%2E`, so no
/// name can be `.`, `..`, hidden, or leave its directory. Names whose
/// encoding passes 200 bytes are cut and end in `~` and a hash of the whole
/// name, which keeps them under the 255-byte file name limit and distinct.
std::string encode_name(std::string_view name);

/// The step as the 8-digit (or longer) file stem: 100 -> "00000100".
std::string step_stem(std::int64_t step);

}  // namespace tensortap::detail
