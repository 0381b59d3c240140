#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include <c10/util/ArrayRef.h>

namespace tensortap::detail {

/// Appends `v` in decimal.
void append_int(std::string& out, std::int64_t v);

/// Appends `s` to `out` as a quoted JSON string. Valid UTF-8 passes through;
/// control characters are escaped, and each byte that is not valid UTF-8
/// becomes \u00XX so the line stays valid JSON whatever a name holds.
void append_json_string(std::string& out, std::string_view s);

/// Appends `[a,b,c]`.
void append_json_ints(std::string& out, c10::IntArrayRef values);

}  // namespace tensortap::detail
