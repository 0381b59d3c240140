#pragma once

// How every part of tensortap throws: an `Error` whose message starts with
// "tensortap: ", formatted here and nowhere else, as TORCH_CHECK does for
// LibTorch. Messages say what was expected and what came, and name the path,
// tensor, dtype or shape involved.

#include <utility>

#include <fmt/format.h>

#include <tensortap/error.h>

namespace tensortap::detail {

/// Throws `Error("tensortap: " + the formatted message)`.
template <typename... Args>
[[noreturn]] void fail(fmt::format_string<Args...> format, Args&&... args) {
  throw Error("tensortap: " + fmt::format(format, std::forward<Args>(args)...));
}

}  // namespace tensortap::detail

/// Throws `Error` with the formatted message unless `cond` holds.
#define TENSORTAP_CHECK(cond, ...)                                   \
  do {                                                               \
    if (!(cond)) ::tensortap::detail::fail(__VA_ARGS__);             \
  } while (false)
