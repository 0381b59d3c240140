#include "sdk/src/run/environment.h"

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <limits>
#include <vector>

#include <fmt/format.h>

#include "sdk/src/sinks/option_table.h"
#include "writers/src/check.h"
#include "writers/src/stats_file.h"

namespace tensortap::detail {
namespace {

// The pairs of `text`: split at the commas that no backslash escapes; `\,`
// becomes a comma, any other backslash stays (regular expressions need no
// doubling).
std::vector<std::string> pairs(const std::string& text) {
  std::vector<std::string> out(1);
  for (std::size_t i = 0; i < text.size(); ++i) {
    if (text[i] == '\\' && i + 1 < text.size() && text[i + 1] == ',') {
      out.back() += ',';
      ++i;
    } else if (text[i] == ',') {
      out.emplace_back();
    } else {
      out.back() += text[i];
    }
  }
  return out;
}

// One key=value, set through the option table (sinks/option_table.h).
void apply(Options& o, const OptionText& t) {
  const OptionRow* row = option_row(t.key);
  if (row == nullptr) t.bad("an unknown key");
  if (row->from_text == nullptr) t.bad(fmt::format("{} cannot be set here: {}", t.key, row->not_env));
  row->from_text(o, t);
}

}  // namespace

bool tensortap_off() {
  const char* v = std::getenv("TENSORTAP");
  if (v == nullptr) return false;
  const std::string l = lower(trim(v));
  if (l.empty() || l == "on") return false;
  if (l == "off" || l == "0" || l == "false") return true;
  fail("TENSORTAP={}: expected off (or 0, false) to turn tensortap off, or on (or empty) to leave it on", v);
}

namespace {

// A two-word switch read from the environment: `yes` or `no` (any case,
// spaces around), `fallback` when unset or empty; anything else refused
// naming the variable, its value and what it chooses.
bool env_switch(const char* var, const char* yes, const char* no, bool fallback, const char* what) {
  const char* v = std::getenv(var);
  if (v == nullptr || *v == '\0') return fallback;
  const std::string l = lower(trim(v));
  if (l == yes) return true;
  if (l == no) return false;
  fail("{}={}: expected {} or {} ({})", var, v, yes, no, what);
}

}  // namespace

bool cuda_stats_in_arena() {
  return env_switch("TENSORTAP_CUDA_STATS", "arena", "tensor", kCudaStatsInArena,
                    "how statistics of CUDA tensors reach the copier");
}

bool cuda_batch() {
  return env_switch("TENSORTAP_CUDA_BATCH", "on", "off", kCudaBatch,
                    "one event a step for CUDA snapshots, or one a snapshot");
}

void apply_options_text(Options& options, const std::string& text) {
  for (const std::string& raw : pairs(text)) {
    const std::string pair = trim(raw);
    if (pair.empty()) continue;  // a trailing comma, or two in a row
    const std::size_t eq = pair.find('=');
    if (eq == std::string::npos) fail("TENSORTAP_OPTIONS: '{}' is not key=value", pair);
    const OptionText s{trim(pair.substr(0, eq)), trim(pair.substr(eq + 1))};
    if (s.key.empty()) fail("TENSORTAP_OPTIONS: '{}' has no key", pair);
    apply(options, s);
  }
}

std::optional<std::string> apply_environment(Options& options) {
  const char* v = std::getenv("TENSORTAP_OPTIONS");
  if (v == nullptr) return std::nullopt;
  apply_options_text(options, v);
  return std::string(v);
}

}  // namespace tensortap::detail
