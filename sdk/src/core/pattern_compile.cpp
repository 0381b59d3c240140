#include "sdk/src/core/pattern.h"

// Parsing and compiling a pattern into the automaton Pattern::search runs
// (sdk/src/core/pattern.cpp).

#include <memory>

#include <fmt/format.h>

#include "writers/src/check.h"

namespace tensortap::detail {
namespace {

// The parsed pattern. Parsing recurses once per nesting level of groups,
// which is bounded, never per character of a name.
struct Node {
  enum class Type { Empty, Byte, Any, Class, Concat, Alternate, Repeat, LineBegin, LineEnd, WordEdge, NotWordEdge };
  Type type = Type::Empty;
  unsigned char byte = 0;
  std::int32_t cls = 0;
  // Repeat: kids[0] between min and max (-1: no limit) times.
  int min = 0, max = 0;
  std::vector<Node> kids;
};

constexpr int kMaxNesting = 100;
// {n,m} counts above this would only build a huge automaton.
constexpr int kMaxCount = 1000;

}  // namespace

// Parses and compiles a pattern into a Pattern's program.
class PatternCompiler {
 public:
  PatternCompiler(Pattern& out, const std::string& pattern, const char* option, bool ignore_case)
      : out_(out), p_(pattern), option_(option), icase_(ignore_case) {}

  void run() {
    if (p_.size() > Pattern::kMaxLength)
      fail(0, fmt::format("the pattern is {} bytes long; at most {} are accepted", p_.size(), Pattern::kMaxLength));
    Node root = alternation(0);
    if (i_ < p_.size()) fail(i_, "unmatched ')'");
    compile(root);
    emit({Pattern::Op::Match});
  }

 private:
  using Op = Pattern::Op;

  [[noreturn]] void fail(std::size_t at, const std::string& why) const {
    ::tensortap::detail::fail("Options::{}(\"{}\") is not a pattern tensortap accepts: {} (at offset {})", option_,
                              p_.size() > 200 ? p_.substr(0, 200) + "..." : p_, why, at);
  }

  bool more() const { return i_ < p_.size(); }
  char peek() const { return p_[i_]; }

  Node alternation(int depth) {
    if (depth > kMaxNesting) fail(i_, fmt::format("groups nest deeper than {}", kMaxNesting));
    Node alt;
    alt.type = Node::Type::Alternate;
    alt.kids.push_back(concatenation(depth));
    while (more() && peek() == '|') {
      ++i_;
      alt.kids.push_back(concatenation(depth));
    }
    return alt.kids.size() == 1 ? std::move(alt.kids[0]) : std::move(alt);
  }

  Node concatenation(int depth) {
    Node cat;
    cat.type = Node::Type::Concat;
    while (more() && peek() != '|' && peek() != ')') {
      Node atom = this->atom(depth);
      quantifiers(atom);
      cat.kids.push_back(std::move(atom));
    }
    return cat;
  }

  // Reads a count of a {n,m} quantifier.
  bool number(int& n) {
    const std::size_t start = i_;
    long v = 0;
    while (more() && peek() >= '0' && peek() <= '9') {
      v = v * 10 + (peek() - '0');
      if (v > kMaxCount) fail(start, fmt::format("a repeat count above {}", kMaxCount));
      ++i_;
    }
    n = static_cast<int>(v);
    return i_ > start;
  }

  void quantifiers(Node& atom) {
    // One quantifier per atom, as ECMAScript has it ("a**" is an error).
    for (bool quantified = false; more(); quantified = true) {
      const std::size_t at = i_;
      int min = 0, max = -1;
      const char c = peek();
      if (c == '*') {
        ++i_;
      } else if (c == '+') {
        min = 1;
        ++i_;
      } else if (c == '?') {
        max = 1;
        ++i_;
      } else if (c == '{') {
        ++i_;
        if (!number(min)) fail(at, "'{' that does not start a repeat count {n}, {n,} or {n,m}");
        max = min;
        if (more() && peek() == ',') {
          ++i_;
          max = -1;
          if (more() && peek() != '}' && !number(max)) fail(at, "a bad repeat count");
        }
        if (!more() || peek() != '}') fail(at, "a repeat count without its '}'");
        ++i_;
        if (max >= 0 && max < min) fail(at, "a repeat count {n,m} with m < n");
      } else {
        return;
      }
      if (quantified) fail(at, "a quantifier on a quantifier");
      if (atom.type == Node::Type::LineBegin || atom.type == Node::Type::LineEnd || atom.type == Node::Type::WordEdge ||
          atom.type == Node::Type::NotWordEdge)
        fail(at, "a quantifier on an anchor");
      // A lazy quantifier matches the same names as a greedy one.
      if (more() && peek() == '?') ++i_;
      Node rep;
      rep.type = Node::Type::Repeat;
      rep.min = min;
      rep.max = max;
      rep.kids.push_back(std::move(atom));
      atom = std::move(rep);
    }
  }

  Node leaf(Node::Type t, unsigned char b = 0) {
    Node n;
    n.type = t;
    n.byte = b;
    return n;
  }

  // A byte the pattern names: under ignore_case a letter is a class of both
  // its cases, so the automaton and search() stay as they are.
  Node literal(unsigned char b) {
    if (!icase_ || !is_letter(b)) return leaf(Node::Type::Byte, b);
    std::bitset<256> both;
    both.set(b);
    both.set(other_case(b));
    return class_node(both);
  }
  static bool is_letter(int c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'); }
  static int other_case(int c) { return c >= 'a' ? c - 'a' + 'A' : c - 'A' + 'a'; }
  // Both cases of every letter in `set`.
  static std::bitset<256> folded(std::bitset<256> set) {
    for (int c = 'a'; c <= 'z'; ++c)
      if (set.test(static_cast<std::size_t>(c)) || set.test(static_cast<std::size_t>(other_case(c)))) {
        set.set(static_cast<std::size_t>(c));
        set.set(static_cast<std::size_t>(other_case(c)));
      }
    return set;
  }

  Node class_node(const std::bitset<256>& set) {
    Node n;
    n.type = Node::Type::Class;
    n.cls = static_cast<std::int32_t>(out_.classes_.size());
    out_.classes_.push_back(set);
    return n;
  }

  static std::bitset<256> digits() {
    std::bitset<256> s;
    for (int c = '0'; c <= '9'; ++c) s.set(c);
    return s;
  }
  static std::bitset<256> words() {
    std::bitset<256> s;
    for (int c = 0; c < 256; ++c)
      if (is_word(static_cast<unsigned char>(c))) s.set(c);
    return s;
  }
  static std::bitset<256> spaces() {
    std::bitset<256> s;
    for (int c : {' ', '\t', '\n', '\r', '\f', '\v'}) s.set(c);
    return s;
  }

  int hex(std::size_t digits_wanted, std::size_t at) {
    int v = 0;
    for (std::size_t k = 0; k < digits_wanted; ++k) {
      if (!more()) fail(at, "a short hexadecimal escape");
      const char c = peek();
      int d;
      if (c >= '0' && c <= '9')
        d = c - '0';
      else if (c >= 'a' && c <= 'f')
        d = c - 'a' + 10;
      else if (c >= 'A' && c <= 'F')
        d = c - 'A' + 10;
      else
        fail(at, "a bad hexadecimal escape");
      v = v * 16 + d;
      ++i_;
    }
    return v;
  }

  // After a backslash: the byte an escape stands for, or a set (\d and the
  // like) in `set`. Returns -1 when it is a set.
  int escape(std::bitset<256>& set, bool in_class) {
    const std::size_t at = i_ - 1;
    if (!more()) fail(at, "a '\\' at the end");
    const char c = peek();
    ++i_;
    switch (c) {
      case 'd': set = digits(); return -1;
      case 'D': set = ~digits(); return -1;
      case 'w': set = words(); return -1;
      case 'W': set = ~words(); return -1;
      case 's': set = spaces(); return -1;
      case 'S': set = ~spaces(); return -1;
      case 'n': return '\n';
      case 'r': return '\r';
      case 't': return '\t';
      case 'f': return '\f';
      case 'v': return '\v';
      case '0': return 0;
      case 'b':
        if (in_class) return '\b';
        fail(at, "internal: \\b outside a class is an anchor");
      case 'x': return hex(2, at);
      case 'u': {
        const int v = hex(4, at);
        if (v > 0xFF) fail(at, "a \\u escape above \\u00FF (names are matched byte by byte)");
        return v;
      }
      case 'c':
        if (more() && ((peek() >= 'a' && peek() <= 'z') || (peek() >= 'A' && peek() <= 'Z'))) return p_[i_++] % 32;
        fail(at, "a bad \\c escape");
      default: break;
    }
    if (c >= '1' && c <= '9') fail(at, "a backreference (it needs a backtracking matcher)");
    if (is_word(static_cast<unsigned char>(c))) fail(at, fmt::format("an unknown escape '\\{}'", c));
    return static_cast<unsigned char>(c);
  }

  Node bracket() {
    const std::size_t at = i_ - 1;
    std::bitset<256> set;
    bool negate = false;
    if (more() && peek() == '^') {
      negate = true;
      ++i_;
    }
    for (;;) {
      if (!more()) fail(at, "a '[' without its ']'");
      if (peek() == ']') {
        ++i_;
        break;
      }
      std::bitset<256> part;
      int lo = 0;
      if (peek() == '\\') {
        ++i_;
        lo = escape(part, /*in_class=*/true);
      } else {
        lo = static_cast<unsigned char>(p_[i_++]);
      }
      if (lo < 0) {
        set |= part;
        continue;
      }
      int hi = lo;
      if (i_ + 1 < p_.size() && peek() == '-' && p_[i_ + 1] != ']') {
        const std::size_t dash = i_;
        ++i_;
        if (peek() == '\\') {
          ++i_;
          hi = escape(part, /*in_class=*/true);
          if (hi < 0) fail(dash, "a range that ends in a class escape");
        } else {
          hi = static_cast<unsigned char>(p_[i_++]);
        }
        if (hi < lo) fail(dash, "a range out of order");
      }
      for (int c = lo; c <= hi; ++c) set.set(static_cast<std::size_t>(c));
    }
    // Folded before the negation: under ignore_case [^a] leaves out 'A' too.
    if (icase_) set = folded(set);
    return class_node(negate ? ~set : set);
  }

  Node atom(int depth) {
    const std::size_t at = i_;
    const char c = p_[i_++];
    switch (c) {
      case '^': return leaf(Node::Type::LineBegin);
      case '$': return leaf(Node::Type::LineEnd);
      case '.': return leaf(Node::Type::Any);
      case '[': return bracket();
      case '*':
      case '+':
      case '?': fail(at, "a quantifier with nothing to repeat");
      case '{': {
        int n;
        const std::size_t save = i_;
        if (number(n)) fail(at, "a quantifier with nothing to repeat");
        i_ = save;
        return literal('{');
      }
      case '(': {
        if (more() && peek() == '?') {
          if (i_ + 1 < p_.size() && p_[i_ + 1] == ':') {
            i_ += 2;
          } else {
            fail(at, "lookaround or a named group (it needs a backtracking matcher)");
          }
        }
        Node inner = alternation(depth + 1);
        if (!more() || peek() != ')') fail(at, "a '(' without its ')'");
        ++i_;
        return inner;
      }
      case '\\': {
        if (more() && (peek() == 'b' || peek() == 'B')) {
          const bool edge = peek() == 'b';
          ++i_;
          return leaf(edge ? Node::Type::WordEdge : Node::Type::NotWordEdge);
        }
        std::bitset<256> set;
        const int b = escape(set, /*in_class=*/false);
        return b < 0 ? class_node(set) : literal(static_cast<unsigned char>(b));
      }
      default: return literal(static_cast<unsigned char>(c));
    }
  }

  std::int32_t emit(Pattern::State s) {
    if (out_.program_.size() >= Pattern::kMaxStates)
      fail(0, fmt::format("its automaton would have more than {} states", Pattern::kMaxStates));
    out_.program_.push_back(s);
    return static_cast<std::int32_t>(out_.program_.size() - 1);
  }
  std::int32_t here() const { return static_cast<std::int32_t>(out_.program_.size()); }

  void compile(const Node& n) {
    using T = Node::Type;
    switch (n.type) {
      case T::Empty: return;
      case T::Byte: emit({Op::Byte, n.byte}); return;
      case T::Any: emit({Op::Any}); return;
      case T::Class: emit({Op::Class, 0, n.cls}); return;
      case T::LineBegin: emit({Op::LineBegin}); return;
      case T::LineEnd: emit({Op::LineEnd}); return;
      case T::WordEdge: emit({Op::WordEdge}); return;
      case T::NotWordEdge: emit({Op::NotWordEdge}); return;
      case T::Concat:
        for (const Node& k : n.kids) compile(k);
        return;
      case T::Alternate: {
        // split(k0, split(k1, ... kN)), each branch jumping to the end.
        std::vector<std::int32_t> jumps;
        for (std::size_t k = 0; k < n.kids.size(); ++k) {
          if (k + 1 < n.kids.size()) {
            const std::int32_t split = emit({Op::Split});
            out_.program_[split].x = here();
            compile(n.kids[k]);
            jumps.push_back(emit({Op::Jump}));
            out_.program_[split].y = here();
          } else {
            compile(n.kids[k]);
          }
        }
        for (std::int32_t j : jumps) out_.program_[j].x = here();
        return;
      }
      case T::Repeat: {
        const Node& body = n.kids[0];
        for (int k = 0; k < n.min; ++k) compile(body);
        if (n.max < 0) {
          // loop: split(body, out); body; jump loop
          const std::int32_t loop = emit({Op::Split});
          out_.program_[loop].x = here();
          compile(body);
          out_.program_[emit({Op::Jump})].x = loop;
          out_.program_[loop].y = here();
          return;
        }
        // Each optional copy may be skipped to the end.
        std::vector<std::int32_t> splits;
        for (int k = n.min; k < n.max; ++k) {
          const std::int32_t split = emit({Op::Split});
          out_.program_[split].x = here();
          splits.push_back(split);
          compile(body);
        }
        for (std::int32_t s : splits) out_.program_[s].y = here();
        return;
      }
    }
  }

  Pattern& out_;
  const std::string& p_;
  const char* option_;
  const bool icase_;
  std::size_t i_ = 0;
};

Pattern::Pattern(const std::string& pattern, const char* option, bool ignore_case) {
  if (pattern.empty()) return;
  PatternCompiler(*this, pattern, option, ignore_case).run();
}

}  // namespace tensortap::detail
