#include "sdk/src/run/environment.h"

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <limits>
#include <vector>

#include <fmt/format.h>

#include "writers/src/check.h"
#include "writers/src/stats_file.h"

namespace tensortap::detail {
namespace {

std::string lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return s;
}

std::string trim(const std::string& s) {
  const std::size_t a = s.find_first_not_of(" \t\r\n");
  if (a == std::string::npos) return "";
  return s.substr(a, s.find_last_not_of(" \t\r\n") - a + 1);
}

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

// One key and its value, for the messages.
struct Setting {
  std::string key, value;

  [[noreturn]] void bad(const std::string& why) const {
    fail("TENSORTAP_OPTIONS: {}={}: {}", key, value, why);
  }

  std::uint64_t unsigned_int(const std::string& s, const char* what) const {
    if (s.empty() || !std::all_of(s.begin(), s.end(), [](unsigned char c) { return std::isdigit(c); }))
      bad(fmt::format("expected {}", what));
    std::uint64_t v = 0;
    for (const char c : s) {
      const auto d = static_cast<std::uint64_t>(c - '0');
      if (v > (static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max()) - d) / 10)
        bad("too large (at most 2^63 - 1)");
      v = v * 10 + d;
    }
    return v;
  }
  std::int64_t integer() const { return static_cast<std::int64_t>(unsigned_int(value, "a non-negative integer")); }
  bool boolean() const {
    const std::string v = lower(value);
    if (v == "1" || v == "true" || v == "on") return true;
    if (v == "0" || v == "false" || v == "off") return false;
    bad("expected a boolean: 1, 0, true, false, on or off");
  }
  // A size: an integer and an optional K, M, G or T (powers of 1024, any
  // case), with an optional "iB" after it.
  std::size_t size() const {
    const std::string l = lower(value);
    std::size_t digits = 0;
    while (digits < l.size() && std::isdigit(static_cast<unsigned char>(l[digits]))) ++digits;
    const std::string unit = l.substr(digits);
    int shift = -1;
    for (const auto& [name, bits] : {std::pair<const char*, int>{"", 0}, {"k", 10}, {"m", 20}, {"g", 30}, {"t", 40},
                                     {"kib", 10}, {"mib", 20}, {"gib", 30}, {"tib", 40}})
      if (unit == name) shift = bits;
    if (shift < 0) bad("expected a size: a number of bytes, or with K, M, G or T (powers of 1024)");
    const std::uint64_t n = unsigned_int(l.substr(0, digits), "a size: a number of bytes, or with K, M, G or T");
    if (n > (static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max()) >> shift))
      bad("too large (at most 2^63 - 1 bytes)");
    return static_cast<std::size_t>(n << shift);
  }
  // A duration: an integer and ms, s, m or h; bare: seconds. At most a year:
  // a watchdog past that is a typo, and the clock arithmetic stays far from
  // overflowing.
  std::chrono::milliseconds duration() const {
    const std::string l = lower(value);
    std::size_t digits = 0;
    while (digits < l.size() && std::isdigit(static_cast<unsigned char>(l[digits]))) ++digits;
    const std::string unit = l.substr(digits);
    std::uint64_t per = 0;
    if (unit.empty() || unit == "s") per = 1000;
    else if (unit == "ms") per = 1;
    else if (unit == "m") per = 60'000;
    else if (unit == "h") per = 3'600'000;
    else bad("expected a duration: a number with ms, s, m or h (bare: seconds)");
    const std::uint64_t n = unsigned_int(l.substr(0, digits), "a duration: a number with ms, s, m or h");
    constexpr std::uint64_t kYearMs = 365ULL * 24 * 3'600'000;
    if (n > kYearMs / per) bad("longer than a year");
    return std::chrono::milliseconds(static_cast<std::int64_t>(n * per));
  }
  // A list joined by '+'.
  std::vector<std::string> list() const {
    std::vector<std::string> out;
    if (value.empty()) return out;
    std::size_t start = 0;
    while (true) {
      const std::size_t plus = value.find('+', start);
      out.push_back(trim(value.substr(start, plus == std::string::npos ? std::string::npos : plus - start)));
      if (out.back().empty()) bad("an empty item in the list (items are joined by '+')");
      if (plus == std::string::npos) return out;
      start = plus + 1;
    }
  }
  std::vector<std::int64_t> integers() const {
    std::vector<std::int64_t> out;
    for (const std::string& s : list()) out.push_back(static_cast<std::int64_t>(unsigned_int(s, "non-negative integers joined by '+'")));
    return out;
  }
  // One of `names`, as run.json spells it.
  template <class E>
  E one_of(std::initializer_list<std::pair<const char*, E>> names) const {
    std::string all;
    for (const auto& [n, e] : names) {
      if (value == n) return e;
      all += (all.empty() ? "" : ", ") + std::string(n);
    }
    bad("expected one of " + all);
  }
};

Kind kind_of(const Setting& s, const std::string& name) {
  for (Kind k : kAllKinds)
    if (name == kind_name(k)) return k;
  s.bad(fmt::format("'{}' is not a kind (activation, activation_grad, param, buffer, grad, tensor)", name));
}

void apply(Options& o, const Setting& s) {
  const std::string& k = s.key;
  if (k == "dir") o.dir(s.value);
  else if (k == "format")
    o.format(s.one_of<Format>({{"npy", Format::Npy}, {"hdf5", Format::Hdf5}, {"packed", Format::Packed}}));
  else if (k == "every") o.every(s.integer());
  else if (k.rfind("every.", 0) == 0) o.every(kind_of(s, k.substr(6)), s.integer());
  else if (k == "steps") o.steps(s.integers());
  else if (k == "start") o.start(s.integer());
  else if (k == "stop") o.stop(lower(s.value) == "none" ? std::nullopt : std::optional<std::int64_t>(s.integer()));
  else if (k == "include") o.include(s.value);
  else if (k == "exclude") o.exclude(s.value);
  else if (k == "kinds") {
    std::vector<Kind> kinds;
    for (const std::string& n : s.list()) kinds.push_back(kind_of(s, n));
    KindSet set = KindSet::none();
    for (Kind kind : kAllKinds)
      if (std::find(kinds.begin(), kinds.end(), kind) != kinds.end()) set = set.with(kind);
    o.kinds(set);
  } else if (k == "buffer_bytes") o.buffer_bytes(s.size());
  else if (k == "overflow")
    o.overflow(s.one_of<Overflow>({{"block", Overflow::Block}, {"drop_newest", Overflow::DropNewest}}));
  else if (k == "overwrite") o.overwrite(s.boolean());
  else if (k == "hdf5.deflate") o.hdf5().deflate(static_cast<int>(std::min<std::int64_t>(s.integer(), 1 << 20)));
  else if (k == "hdf5.shuffle") o.hdf5().shuffle(s.boolean());
  else if (k == "hdf5.chunk_bytes") o.hdf5().chunk_bytes(s.size());
  else if (k == "hdf5.flush_every") o.hdf5().flush_every(s.integer());
  else if (k == "packed.segment_bytes") o.packed().segment_bytes(s.size());
  else if (k == "on_error") o.on_error(s.one_of<OnError>({{"continue", OnError::Continue}, {"stop", OnError::Stop}}));
  else if (k == "capture_eval") o.capture_eval(s.boolean());
  else if (k == "grad_per_backward") o.grad_per_backward(s.boolean());
  else if (k == "tap_sequential") o.tap_sequential(s.value);
  else if (k == "capture_ops") o.capture_ops(s.boolean());
  else if (k == "stats_every") o.stats_every(s.integer());
  else if (k == "tensorboard") {
    // On keeps settings given in code (or nested keys before this one).
    if (!s.boolean()) o.tensorboard(false);
    else if (!o.tensorboard()) o.tensorboard(true);
  } else if (k == "tensorboard.histograms_every" || k == "tensorboard.stats") {
    TensorBoardOptions tb = o.tensorboard().value_or(TensorBoardOptions());
    if (k == "tensorboard.stats") tb.stats(s.list());
    else tb.histograms_every(s.integer());
    o.tensorboard(tb);
  } else if (k == "flight_recorder") o.flight_recorder(s.integer());
  else if (k == "flight_recorder_bytes") o.flight_recorder_bytes(s.size());
  else if (k == "after_dump")
    o.after_dump(s.one_of<AfterDump>(
        {{"continue", AfterDump::Continue}, {"stop_capture", AfterDump::StopCapture}, {"throw", AfterDump::Throw}}));
  else if (k == "rank") o.rank(s.integer());
  else if (k == "world_size") o.world_size(s.integer());
  else if (k == "ranks") o.ranks(s.integers());
  else if (k == "max_bytes") o.max_bytes(s.size());
  else if (k == "on_budget")
    o.on_budget(s.one_of<Budget>({{"stop_capture", Budget::StopCapture}, {"keep_latest", Budget::KeepLatest}}));
  else if (k == "dumps_percent") o.dumps_percent(static_cast<int>(std::min<std::int64_t>(s.integer(), 1000)));
  else if (k == "stall_after") o.stall_after(s.duration());
  else if (k == "dump_on") s.bad("dump_on cannot be set here: set in code (Options::dump_on(Trigger))");
  else s.bad("an unknown key");
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

bool cuda_stats_in_arena() {
  const char* v = std::getenv("TENSORTAP_CUDA_STATS");
  if (v == nullptr || *v == '\0') return kCudaStatsInArena;
  const std::string l = lower(trim(v));
  if (l == "arena") return true;
  if (l == "tensor") return false;
  fail("TENSORTAP_CUDA_STATS={}: expected arena or tensor (how statistics of CUDA tensors reach the copier)", v);
}

void apply_options_text(Options& options, const std::string& text) {
  for (const std::string& raw : pairs(text)) {
    const std::string pair = trim(raw);
    if (pair.empty()) continue;  // a trailing comma, or two in a row
    const std::size_t eq = pair.find('=');
    if (eq == std::string::npos) fail("TENSORTAP_OPTIONS: '{}' is not key=value", pair);
    const Setting s{trim(pair.substr(0, eq)), trim(pair.substr(eq + 1))};
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
