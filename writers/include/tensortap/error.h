#pragma once

#include <stdexcept>
#include <string>

namespace tensortap {

/// The exception tensortap throws. Its message names what failed: the path,
/// the tensor name, dtype and shape, and the OS error where there is one.
class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what) : std::runtime_error(what) {}
};

}  // namespace tensortap
