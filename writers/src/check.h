#pragma once

// How every part of tensortap throws: an `Error` whose message starts with
// "tensortap: ", formatted here and nowhere else, as TORCH_CHECK does for
// LibTorch. Messages say what was expected and what came, and name the path,
// tensor, dtype or shape involved.

#include <system_error>
#include <utility>

#include <fmt/format.h>

#include <tensortap/error.h>

namespace tensortap::detail {

/// Throws `Error("tensortap: " + the formatted message)`, or `E`, a kind of
/// `Error` a caller tells apart (`fail<Hdf5Failure>(...)`).
template <typename E = Error, typename... Args>
[[noreturn]] void fail(fmt::format_string<Args...> format, Args&&... args) {
  throw E("tensortap: " + fmt::format(format, std::forward<Args>(args)...));
}

/// Throws `Error("tensortap: " + the formatted message, code)`: for failures
/// the OS reported, so callers can act on the code (a full disk) as well.
template <typename... Args>
[[noreturn]] void fail(std::error_code code, fmt::format_string<Args...> format, Args&&... args) {
  throw Error("tensortap: " + fmt::format(format, std::forward<Args>(args)...), code);
}

}  // namespace tensortap::detail

/// Throws `Error` with the formatted message unless `cond` holds.
#define TENSORTAP_CHECK(cond, ...)                       \
  do {                                                   \
    if (!(cond)) ::tensortap::detail::fail(__VA_ARGS__); \
  } while (false)
