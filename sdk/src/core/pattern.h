#pragma once

#include <bitset>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace tensortap::detail {

/// Whether `c` is a word byte for `\w` and `\b`: ASCII letters, digits, '_'.
inline bool is_word(unsigned char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_';
}

/// A regular expression in ECMAScript syntax, for selecting names
/// (`Options::include`, `exclude`, `tap_sequential`).
///
/// `std::regex` backtracks, recursing once per character: a 20 kB name
/// overflows the stack, and a pattern like `(a|aa)*c` takes exponential
/// time. Names come from users' models, so this matcher instead simulates
/// the pattern's automaton over the name (Thompson's construction, run as a
/// set of states): time proportional to the name's length times the
/// pattern's size, memory proportional to the pattern, and no recursion on
/// the name. It supports what selecting names needs: literals, `.`, classes
/// (`[a-z]`, `[^.]`, `\d`, `\w`, `\s` and their negations), anchors `^` `$`,
/// `\b` `\B`, groups `(...)` and `(?:...)`, alternation, and the greedy and
/// lazy quantifiers `*` `+` `?` `{n}` `{n,}` `{n,m}` (for whether a name
/// matches, lazy and greedy are the same). Backreferences and lookaround
/// need backtracking and are refused with an error, as is a pattern whose
/// automaton would be too large.
///
/// `ignore_case` matches ASCII letters without regard to case, as
/// ECMAScript's `icase` (and Python's re.IGNORECASE | re.ASCII, which the
/// training health rules' definition names): a literal letter and every
/// class fold both cases, a class before it is negated, so `[^a]` takes
/// neither `a` nor `A`.
class Pattern {
 public:
  /// The empty pattern, which matches every name.
  Pattern() = default;
  /// Compiles `pattern`. Throws `Error` naming `option` (e.g. "include"),
  /// the pattern and what is wrong at which position.
  Pattern(const std::string& pattern, const char* option, bool ignore_case = false);

  /// Whether the pattern matches anywhere in `s`, as `std::regex_search`.
  bool search(std::string_view s) const;
  bool empty() const { return program_.empty(); }

  /// The most states a compiled pattern may have.
  static constexpr std::size_t kMaxStates = 20000;
  /// The longest pattern accepted.
  static constexpr std::size_t kMaxLength = 4096;

 private:
  enum class Op : std::uint8_t { Byte, Any, Class, Split, Jump, Match, LineBegin, LineEnd, WordEdge, NotWordEdge };
  struct State {
    Op op;
    unsigned char byte = 0;
    // Class: the index in classes_; Split: the two next states; Jump: x.
    std::int32_t x = 0, y = 0;
  };
  friend class PatternCompiler;
  std::vector<State> program_;
  std::vector<std::bitset<256>> classes_;
};

}  // namespace tensortap::detail
