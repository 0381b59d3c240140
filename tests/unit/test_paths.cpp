#include <set>

#include "tests/support/helpers.h"
#include "writers/src/json.h"
#include "writers/src/paths.h"

using tensortap::detail::append_json_string;
using tensortap::detail::encode_name;

TEST_CASE("names become one safe path component", "[writers][paths]") {
  REQUIRE(encode_name("encoder.0.weight") == "encoder.0.weight");
  REQUIRE(encode_name("hidden#1") == "hidden#1");
  REQUIRE(encode_name("a/b") == "a%2Fb");
  REQUIRE(encode_name("..") == "%2E.");
  REQUIRE(encode_name(".hidden") == "%2Ehidden");
  REQUIRE(encode_name("../../etc/passwd") == "%2E.%2F..%2Fetc%2Fpasswd");
  REQUIRE(encode_name(std::string("a\0b", 3)) == "a%00b");
  REQUIRE(encode_name("100%") == "100%25");
  REQUIRE(encode_name("poids/\xc3\xa9t\xc3\xa9") == "poids%2F%C3%A9t%C3%A9");
  REQUIRE(encode_name("") == "%00empty");
  for (const std::string& n : {std::string("a/b"), std::string(".."), std::string("x\\y z")}) {
    const std::string e = encode_name(n);
    REQUIRE(e.find('/') == std::string::npos);
    REQUIRE(e.find('\\') == std::string::npos);
    REQUIRE(e != "..");
    REQUIRE(e[0] != '.');
  }
}

TEST_CASE("long names are cut below the file name limit and stay distinct", "[writers][paths]") {
  std::set<std::string> seen;
  for (int i = 0; i < 50; ++i) {
    const std::string name = std::string(300, 'x') + std::to_string(i);
    const std::string e = encode_name(name);
    REQUIRE(e.size() <= 200);
    seen.insert(e);
  }
  REQUIRE(seen.size() == 50);
  // An escape is never cut in half.
  const std::string e = encode_name(std::string(400, '/'));
  REQUIRE(e.size() <= 200);
  const size_t tilde = e.rfind('~');
  for (size_t i = 0; i < tilde; i += 3) REQUIRE(e.compare(i, 3, "%2F") == 0);
}

TEST_CASE("JSON strings escape quotes, control bytes and invalid UTF-8", "[writers][json]") {
  std::string out;
  append_json_string(out, std::string("a\"b\\c\n\x01\0", 8));
  REQUIRE(out == "\"a\\\"b\\\\c\\n\\u0001\\u0000\"");
  out.clear();
  // A byte that is not UTF-8 becomes U+DC00 + byte (Python's
  // surrogateescape), never the character of the same number: "\xff" alone
  // must not read back as "ÿ".
  append_json_string(out, "\xc3\xa9\xff");
  REQUIRE(out == "\"\xc3\xa9\\udcff\"");
  out.clear();
  append_json_string(out, "\xed\xa0\x80");  // a UTF-16 surrogate is not UTF-8
  REQUIRE(out == "\"\\udced\\udca0\\udc80\"");
  out.clear();
  std::string lone, real;
  append_json_string(lone, "\xc3");
  append_json_string(real, "\xc3\x83");
  REQUIRE(lone != real);
}
