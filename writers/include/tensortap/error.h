#pragma once

#include <stdexcept>
#include <string>
#include <system_error>

namespace tensortap {

/// The exception tensortap throws. Its message names what failed: the path,
/// the tensor name, dtype and shape, and the OS error where there is one.
class Error : public std::runtime_error {
 public:
  /// `code` is the OS error (std::system_category) when one caused it, so a
  /// caller can tell ENOSPC from EACCES without parsing the message.
  explicit Error(const std::string& what, std::error_code code = {}) : std::runtime_error(what), code_(code) {}
  /// The OS error behind this one; empty (false) when there was none.
  std::error_code code() const noexcept { return code_; }

 private:
  std::error_code code_;
};

}  // namespace tensortap
