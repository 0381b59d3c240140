// The name matcher behind include/exclude/tap_sequential: what std::regex
// says on ordinary patterns, and no hang or crash on hostile ones.
#include <random>
#include <regex>
#include <string>

#include <catch2/catch.hpp>

#include <tensortap/error.h>

#include "sdk/src/core/pattern.h"

using tensortap::detail::Pattern;

namespace {

std::string error_of(const std::string& pattern) {
  try {
    Pattern p(pattern, "include");
  } catch (const tensortap::Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST_CASE("patterns match names as std::regex_search does", "[sdk][pattern]") {
  struct Case {
    const char* pattern;
    const char* name;
    bool match;
  };
  const Case cases[] = {
      {"fc", "encoder.fc1.weight", true},
      {"^fc", "encoder.fc1.weight", false},
      {"weight$", "fc1.weight", true},
      {"weight$", "fc1.weight.grad", false},
      {"^fc[0-9]+\\.bias$", "fc12.bias", true},
      {"^fc[0-9]+\\.bias$", "fc.bias", false},
      {"\\.(weight|bias)$", "a.bias", true},
      {"(?:ab)+c", "xababc", true},
      {"a{2,3}", "xaay", true},
      {"a{3}", "xaay", false},
      {"a{2,}b", "aaaab", true},
      {"[^.]+$", "a.b", true},
      {"^[^.]+$", "a.b", false},
      {"\\bfc\\b", "x.fc.y", true},
      {"\\bfc\\b", "xfc.y", false},
      {"\\Bc", "abc", true},
      {"\\d\\w\\s", "x1a y", true},
      {"\\D\\W\\S", "a1.x", false},
      {"a.c", "a\nc", false},
      {"a.c", "abc", true},
      {"colou?r", "color", true},
      {"(a|)b", "b", true},
      {"x*", "", true},
      {"^$", "", true},
      {"^$", "a", false},
      {"[a\\-z]", "-", true},
      {"[\\]]", "]", true},
      {"\\x41", "A", true},
      {"a+?b", "aab", true},
      {"(a*)*b", "aaab", true},
      {"0\\.weight", "encoder.0.weight", true},
      {"[.]", "a.b", true},
  };
  for (const Case& c : cases) {
    INFO("pattern " << c.pattern << " name " << c.name);
    REQUIRE(Pattern(c.pattern, "include").search(c.name) == c.match);
    REQUIRE(std::regex_search(std::string(c.name), std::regex(c.pattern, std::regex::ECMAScript)) == c.match);
  }
  REQUIRE(Pattern().search("anything"));
  REQUIRE(Pattern("", "include").empty());
}

TEST_CASE("random patterns agree with std::regex on random names", "[sdk][pattern]") {
  // Small alphabets make matches likely either way; short names keep
  // std::regex's backtracking cheap.
  const std::vector<std::string> atoms = {"a", "b", ".",     "[ab]",   "[^a]", "\\d", "\\w",
                                          "1", "_", "(a|b)", "(?:ab)", "(a|)", "\\."};
  const std::vector<std::string> quants = {"", "", "", "*", "+", "?", "{1,2}", "{2}", "*?", "{0,}"};
  std::mt19937 rng(42);
  auto pick = [&](const std::vector<std::string>& v) { return v[rng() % v.size()]; };
  int compared = 0, matched = 0;
  for (int trial = 0; trial < 3000; ++trial) {
    std::string pattern;
    if (rng() % 4 == 0) pattern += "^";
    const int n = 1 + static_cast<int>(rng() % 4);
    for (int k = 0; k < n; ++k) {
      std::string a = pick(atoms);
      if (rng() % 6 == 0) a = "(" + a + pick(atoms) + "|" + pick(atoms) + ")";
      pattern += a + pick(quants);
    }
    if (rng() % 4 == 0) pattern += "$";
    if (rng() % 8 == 0) pattern = "\\b" + pattern;
    const Pattern mine(pattern, "include");
    const std::regex theirs(pattern, std::regex::ECMAScript);
    for (int s = 0; s < 8; ++s) {
      std::string name;
      const int len = static_cast<int>(rng() % 9);
      for (int k = 0; k < len; ++k) name += "ab1_."[rng() % 5];
      INFO("pattern '" << pattern << "' name '" << name << "'");
      const bool want = std::regex_search(name, theirs);
      REQUIRE(mine.search(name) == want);
      ++compared;
      matched += want;
    }
  }
  // Both outcomes were exercised, many times.
  REQUIRE(matched > compared / 10);
  REQUIRE(compared - matched > compared / 10);
}

TEST_CASE("hostile patterns and names end quickly, without a crash", "[sdk][pattern]") {
  // std::regex recurses per character here and overflows the stack.
  std::string long_name;
  for (int i = 0; i < 20000; ++i) long_name += (i % 2) != 0 ? 'a' : 'b';
  REQUIRE(Pattern("(a|b)*weight", "include").search(long_name + "weight"));
  REQUIRE_FALSE(Pattern("(a|b)*weight", "include").search(long_name));
  // Exponential for a backtracking matcher; linear here.
  const std::string as(5000, 'a');
  REQUIRE_FALSE(Pattern("(a|aa)*c", "include").search(as));
  REQUIRE_FALSE(Pattern("(x+x+)+y", "include").search(std::string(5000, 'x')));
  REQUIRE(Pattern("^(a|aa)*$", "include").search(as));
  // A megabyte-long name is still just a loop.
  REQUIRE(Pattern("z$", "include").search(std::string(1 << 20, 'q') + "z"));
}

TEST_CASE("patterns tensortap cannot match safely are refused, naming the option", "[sdk][pattern]") {
  REQUIRE_THAT(error_of("(a)\\1"), Catch::Contains("Options::include") && Catch::Contains("backreference"));
  REQUIRE_THAT(error_of("a(?=b)"), Catch::Contains("lookaround"));
  REQUIRE_THAT(error_of("(?<n>a)"), Catch::Contains("lookaround"));
  REQUIRE_THAT(error_of("(ab"), Catch::Contains("without its ')'"));
  REQUIRE_THAT(error_of("ab)"), Catch::Contains("unmatched ')'"));
  REQUIRE_THAT(error_of("*a"), Catch::Contains("nothing to repeat"));
  REQUIRE_THAT(error_of("a**"), Catch::Contains("quantifier on a quantifier"));
  REQUIRE_THAT(error_of("[ab"), Catch::Contains("without its ']'"));
  REQUIRE_THAT(error_of("[z-a]"), Catch::Contains("out of order"));
  REQUIRE_THAT(error_of("a{3,1}"), Catch::Contains("m < n"));
  REQUIRE_THAT(error_of("\\q"), Catch::Contains("unknown escape"));
  REQUIRE_THAT(error_of(std::string(Pattern::kMaxLength + 1, 'a')), Catch::Contains("at most 4096"));
  REQUIRE_THAT(error_of("((a{1000}){1000})"), Catch::Contains("more than 20000 states"));
  REQUIRE_THAT(error_of(std::string(200, '(') + std::string(200, ')')), Catch::Contains("nest deeper"));
  REQUIRE_THAT(error_of("a{99999}"), Catch::Contains("repeat count above"));
}
