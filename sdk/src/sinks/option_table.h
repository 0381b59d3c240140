#pragma once

// `Options` as one table: a row per setting, with its TENSORTAP_OPTIONS key,
// its run.json key, how it is set from text and how it is written as JSON.
// The environment's parser (run/environment.cpp) and run.json's "options"
// (sinks/run_json.cpp) both walk it, and a test holds it to options.h
// and docs/options.md: a setter cannot be added to one and not the others.

#include <chrono>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include <tensortap/options.h>

namespace tensortap::detail {

/// `s` in lower case (ASCII), and without the spaces around it: the
/// environment's parsers and the table's.
std::string lower(std::string s);
std::string trim(const std::string& s);

/// One `key=value` of TENSORTAP_OPTIONS, with the parsers of its value.
/// Each refuses what it does not understand, naming the key and the value.
struct OptionText {
  std::string key, value;
  /// Where it came from, as the messages name it.
  std::string source = "TENSORTAP_OPTIONS";

  [[noreturn]] void bad(const std::string& why) const;
  /// A non-negative integer (at most 2^63 - 1).
  std::int64_t integer() const;
  /// 1, 0, true, false, on, off (any case).
  bool boolean() const;
  /// Bytes, with an optional K, M, G or T (powers of 1024, any case, an
  /// optional "iB").
  std::size_t size() const;
  /// An integer and ms, s, m or h (bare: seconds); at most a year.
  std::chrono::milliseconds duration() const;
  /// Items joined by '+', none empty.
  std::vector<std::string> list() const;
  std::vector<std::int64_t> integers() const;
  /// A kind's name (activation, grad, ...).
  Kind kind(const std::string& name) const;
};

/// The words of an enumeration, as run.json and TENSORTAP_OPTIONS spell it.
template <class E>
struct EnumWord {
  const char* word;
  E value;
};
const std::vector<EnumWord<Format>>& words(Format);
const std::vector<EnumWord<Overflow>>& words(Overflow);
const std::vector<EnumWord<OnError>>& words(OnError);
const std::vector<EnumWord<AfterDump>>& words(AfterDump);
const std::vector<EnumWord<Budget>>& words(Budget);

/// The word of `value` ("?" for none).
template <class E>
const char* word_of(E value) {
  for (const EnumWord<E>& w : words(value))
    if (w.value == value) return w.word;
  return "?";
}

/// One setting.
struct OptionRow {
  /// The setter, as options.h (or the option struct it belongs to) names
  /// it: "every", "every(kind)", "Hdf5Options::deflate".
  const char* setter;
  /// Its TENSORTAP_OPTIONS key ("every.<kind>": any kind after "every.");
  /// "" for a setting code alone sets, `not_env` saying why.
  const char* env_key;
  /// Its key in run.json's "options"; "" when another row writes it (a
  /// nested struct's field) or run.json says it elsewhere ("rank").
  const char* json_key;
  void (*from_text)(Options&, const OptionText&);
  /// Appends the value; false: nothing is written (hdf5's settings in a
  /// run of another format).
  bool (*to_json)(std::string&, const Options&);
  const char* not_env;
};

/// Every row, in run.json's order.
const std::vector<OptionRow>& option_table();

/// The row of a TENSORTAP_OPTIONS key, or null.
const OptionRow* option_row(const std::string& env_key);

/// run.json's "options" object, its members one per line indented by
/// `indent` spaces, and its closing brace at `indent - 2`.
void append_options_json(std::string& j, const Options& o, int indent);

}  // namespace tensortap::detail
