#include "sdk/src/core/pattern.h"

// Running a compiled pattern over a name; compiling is
// sdk/src/core/pattern_compile.cpp.

namespace tensortap::detail {

bool Pattern::search(std::string_view s) const {
  if (program_.empty()) return true;
  const std::size_t n = program_.size();
  // The states the automaton is in before byte `pos`, without duplicates
  // (`mark` holds the generation that last added a state).
  std::vector<std::int32_t> current, next, stack;
  current.reserve(n);
  next.reserve(n);
  std::vector<std::uint32_t> mark(n, 0);
  std::uint32_t generation = 1;

  // Adds `start` and every state reachable from it without reading a byte,
  // at position `pos`; true if that reaches Match.
  const auto add = [&](std::vector<std::int32_t>& list, std::int32_t start, std::size_t pos) {
    stack.clear();
    stack.push_back(start);
    while (!stack.empty()) {
      const std::int32_t pc = stack.back();
      stack.pop_back();
      if (mark[pc] == generation) continue;
      mark[pc] = generation;
      const State& st = program_[pc];
      switch (st.op) {
        case Op::Match: return true;
        case Op::Jump: stack.push_back(st.x); break;
        case Op::Split:
          stack.push_back(st.y);
          stack.push_back(st.x);
          break;
        case Op::LineBegin:
          if (pos == 0) stack.push_back(pc + 1);
          break;
        case Op::LineEnd:
          if (pos == s.size()) stack.push_back(pc + 1);
          break;
        case Op::WordEdge:
        case Op::NotWordEdge: {
          const bool before = pos > 0 && is_word(static_cast<unsigned char>(s[pos - 1]));
          const bool after = pos < s.size() && is_word(static_cast<unsigned char>(s[pos]));
          if ((before != after) == (st.op == Op::WordEdge)) stack.push_back(pc + 1);
          break;
        }
        default: list.push_back(pc); break;
      }
    }
    return false;
  };

  for (std::size_t pos = 0;; ++pos) {
    // A search: a match may also start here.
    if (add(current, 0, pos)) return true;
    if (pos == s.size() || current.empty()) {
      if (pos == s.size()) return false;
      // Nothing in flight: skip ahead to where a match could start again.
      ++generation;
      continue;
    }
    const auto c = static_cast<unsigned char>(s[pos]);
    ++generation;
    next.clear();
    for (std::int32_t pc : current) {
      const State& st = program_[pc];
      const bool takes = st.op == Op::Byte    ? st.byte == c
                         : st.op == Op::Any   ? c != '\n' && c != '\r'
                         : st.op == Op::Class ? classes_[st.x].test(c)
                                              : false;
      if (takes && add(next, pc + 1, pos + 1)) return true;
    }
    current.swap(next);
  }
}

}  // namespace tensortap::detail
