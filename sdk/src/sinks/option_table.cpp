#include "sdk/src/sinks/option_table.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <limits>

#include <fmt/format.h>

#include "sdk/src/sinks/trigger_params.h"
#include "writers/src/check.h"
#include "writers/src/json.h"

namespace tensortap::detail {
namespace {

std::uint64_t unsigned_int(const OptionText& t, const std::string& s, const char* what) {
  if (s.empty() || !std::all_of(s.begin(), s.end(), [](unsigned char c) { return std::isdigit(c); }))
    t.bad(fmt::format("expected {}", what));
  std::uint64_t v = 0;
  for (const char c : s) {
    const auto d = static_cast<std::uint64_t>(c - '0');
    if (v > (static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max()) - d) / 10)
      t.bad("too large (at most 2^63 - 1)");
    v = v * 10 + d;
  }
  return v;
}

// One of the enumeration's words, as run.json spells it.
template <class E>
E word(const OptionText& t) {
  std::string all;
  for (const EnumWord<E>& w : words(E{})) {
    if (t.value == w.word) return w.value;
    all += (all.empty() ? "" : ", ") + std::string(w.word);
  }
  t.bad("expected one of " + all);
}

// A double as JSON: NaN and infinities, which JSON lacks, as null.
std::string json_number(double v) { return std::isfinite(v) ? fmt::format("{}", v) : "null"; }

const char* json_bool(bool b) { return b ? "true" : "false"; }

void append_kinds(std::string& j, KindSet kinds) {
  j += "[";
  bool first = true;
  for (Kind k : kAllKinds)
    if (kinds.contains(k)) {
      j += fmt::format("{}\"{}\"", first ? "" : ", ", kind_name(k));
      first = false;
    }
  j += "]";
}

// A health rule's parameters, each under the name `--set` gives it.
void append_health_params(std::string& j, const Trigger& t) {
  const std::uint32_t has = trigger_params(t.type());
  if (has & kParamKinds) {
    j += ", \"kinds\": ";
    append_kinds(j, t.kinds());
  }
  if (has & kParamInclude) {
    j += ", \"include\": ";
    append_json_string(j, t.include());
  }
  if (has & kParamName) {
    j += ", \"name\": ";
    append_json_string(j, t.name());
  }
  const auto number = [&](TriggerParam p, double v) {
    if (has & p) j += fmt::format(", \"{}\": {}", trigger_param_name(p), json_number(v));
  };
  number(kParamThreshold, t.threshold());
  number(kParamBound, t.bound());
  number(kParamFactor, t.factor());
  number(kParamMinDecrease, t.min_decrease());
  number(kParamMinProgress, t.min_progress());
  number(kParamDerivative, t.derivative());
  number(kParamLarge, t.large());
  number(kParamSmall, t.small());
  const auto count = [&](TriggerParam p, std::int64_t v) {
    if (has & p) j += fmt::format(", \"{}\": {}", trigger_param_name(p), v);
  };
  count(kParamPatience, t.patience());
  count(kParamNumSteps, t.num_steps());
  count(kParamWindow, t.window());
}

void append_dump_on(std::string& j, const Options& o) {
  j += "[";
  for (std::size_t i = 0; i < o.dump_on().size(); ++i) {
    const Trigger& t = o.dump_on()[i];
    j += fmt::format("{}{{\"kind\": \"{}\"", i ? ", " : "", t.type_name());
    if (t.type() == Trigger::Type::Spike) {
      j += ", \"name\": ";
      append_json_string(j, t.name());
    }
    if (t.is_health_rule())
      append_health_params(j, t);
    else if (t.window() > 0)
      j += fmt::format(", \"factor\": {}, \"window\": {}", t.factor(), t.window());
    j += fmt::format(", \"cooldown\": {}}}", t.cooldown());
  }
  j += "]";
}

void set_kinds(Options& o, const OptionText& t) {
  std::vector<Kind> kinds;
  for (const std::string& n : t.list()) kinds.push_back(t.kind(n));
  KindSet set = KindSet::none();
  for (Kind kind : kAllKinds)
    if (std::find(kinds.begin(), kinds.end(), kind) != kinds.end()) set = set.with(kind);
  o.kinds(set);
}

void set_tensorboard(Options& o, const OptionText& t) {
  // On keeps settings given in code (or nested keys before this one).
  if (!t.boolean()) o.tensorboard(false);
  else if (!o.tensorboard()) o.tensorboard(true);
}

// A TensorBoardOptions field: on, with the others as they are.
template <class F>
void set_tensorboard_field(Options& o, F&& f) {
  TensorBoardOptions tb = o.tensorboard().value_or(TensorBoardOptions());
  f(tb);
  o.tensorboard(tb);
}

bool json_tensorboard(std::string& j, const Options& o) {
  if (!o.tensorboard()) {
    j += "null";
    return true;
  }
  j += fmt::format("{{\"histograms_every\": {}, \"stats\": [", o.tensorboard()->histograms_every());
  for (std::size_t i = 0; i < o.tensorboard()->stats().size(); ++i) {
    if (i) j += ", ";
    append_json_string(j, o.tensorboard()->stats()[i]);
  }
  j += "]}";
  return true;
}

// The to_json of the rows whose value is more than a field: every(kind)
// for each kind, and the format's own struct (false: not this run's format,
// no key written). Functions of their own, as the table is one line a row.
bool json_every_by_kind(std::string& j, const Options& o) {
  j += "{";
  bool first = true;
  for (Kind k : kAllKinds) {
    j += fmt::format("{}\"{}\": {}", first ? "" : ", ", kind_name(k), o.every(k));
    first = false;
  }
  j += "}";
  return true;
}

bool json_hdf5(std::string& j, const Options& o) {
  if (o.format() != Format::Hdf5) return false;
  const Hdf5Options& h = o.hdf5();
  j += fmt::format("{{\"deflate\": {}, \"shuffle\": {}, \"chunk_bytes\": {}, \"flush_every\": {}}}", h.deflate(),
                   json_bool(h.shuffle()), h.chunk_bytes(), h.flush_every());
  return true;
}

bool json_packed(std::string& j, const Options& o) {
  if (o.format() != Format::Packed) return false;
  j += fmt::format("{{\"segment_bytes\": {}}}", o.packed().segment_bytes());
  return true;
}

// A row's from_text and to_json as captureless lambdas.
#define TT_SET(body) [](Options & o, const OptionText& t) { body; }
#define TT_JSON(body) [](std::string & j, const Options& o) -> bool { body; return true; }
#define TT_STRING(field) TT_JSON(append_json_string(j, o.field()))
#define TT_NUMBER(field) TT_JSON(j += fmt::format("{}", o.field()))
#define TT_BOOL(field) TT_JSON(j += json_bool(o.field()))
#define TT_WORD(field) TT_JSON(j += fmt::format("\"{}\"", word_of(o.field())))

// Leaked, never destroyed: a recorder held in a static closes at exit and
// writes run.json then, possibly after this table's destructor would have
// run (the reliability test's static recorder crashed so).
const std::vector<OptionRow>& rows() {
  static const auto* const table = new std::vector<OptionRow>{
    {"dir", "dir", "dir", TT_SET(o.dir(t.value)), TT_STRING(dir), ""},
    {"format", "format", "format", TT_SET(o.format(word<Format>(t))), TT_WORD(format), ""},
    {"every", "every", "every", TT_SET(o.every(t.integer())), TT_NUMBER(every), ""},
    {"start", "start", "start", TT_SET(o.start(t.integer())), TT_NUMBER(start), ""},
    {"stop", "stop", "stop",
     TT_SET(o.stop(lower(t.value) == "none" ? std::nullopt : std::optional<std::int64_t>(t.integer()))),
     // Unset is null; readers accept the -1 of older runs too.
     TT_JSON(j += o.stop() ? std::to_string(*o.stop()) : std::string("null")), ""},
    {"include", "include", "include", TT_SET(o.include(t.value)), TT_STRING(include), ""},
    {"exclude", "exclude", "exclude", TT_SET(o.exclude(t.value)), TT_STRING(exclude), ""},
    {"kinds", "kinds", "kinds", set_kinds, TT_JSON(append_kinds(j, o.kinds())), ""},
    {"every(kind)", "every.<kind>", "every_by_kind", TT_SET(o.every(t.kind(t.key.substr(6)), t.integer())),
     json_every_by_kind, ""},
    {"steps", "steps", "steps", TT_SET(o.steps(t.integers())), TT_JSON(append_json_ints(j, o.steps())), ""},
    {"ranks", "ranks", "ranks", TT_SET(o.ranks(t.integers())), TT_JSON(append_json_ints(j, o.ranks())), ""},
    {"capture_eval", "capture_eval", "capture_eval", TT_SET(o.capture_eval(t.boolean())), TT_BOOL(capture_eval), ""},
    {"grad_per_backward", "grad_per_backward", "grad_per_backward", TT_SET(o.grad_per_backward(t.boolean())),
     TT_BOOL(grad_per_backward), ""},
    {"capture_ops", "capture_ops", "capture_ops", TT_SET(o.capture_ops(t.boolean())), TT_BOOL(capture_ops), ""},
    {"on_error", "on_error", "on_error", TT_SET(o.on_error(word<OnError>(t))), TT_WORD(on_error), ""},
    {"tap_sequential", "tap_sequential", "tap_sequential", TT_SET(o.tap_sequential(t.value)), TT_STRING(tap_sequential),
     ""},
    {"buffer_bytes", "buffer_bytes", "buffer_bytes", TT_SET(o.buffer_bytes(t.size())), TT_NUMBER(buffer_bytes), ""},
    {"overflow", "overflow", "overflow", TT_SET(o.overflow(word<Overflow>(t))), TT_WORD(overflow), ""},
    {"overwrite", "overwrite", "overwrite", TT_SET(o.overwrite(t.boolean())), TT_BOOL(overwrite), ""},
    {"stats_every", "stats_every", "stats_every", TT_SET(o.stats_every(t.integer())), TT_NUMBER(stats_every), ""},
    {"flight_recorder", "flight_recorder", "flight_recorder", TT_SET(o.flight_recorder(t.integer())),
     TT_NUMBER(flight_recorder), ""},
    {"flight_recorder_bytes", "flight_recorder_bytes", "flight_recorder_bytes",
     TT_SET(o.flight_recorder_bytes(t.size())), TT_NUMBER(flight_recorder_bytes), ""},
    {"after_dump", "after_dump", "after_dump", TT_SET(o.after_dump(word<AfterDump>(t))), TT_WORD(after_dump), ""},
    {"tensorboard", "tensorboard", "tensorboard", set_tensorboard, json_tensorboard, ""},
    {"TensorBoardOptions::histograms_every", "tensorboard.histograms_every", "",
     TT_SET(set_tensorboard_field(o, [&](TensorBoardOptions& tb) { tb.histograms_every(t.integer()); })), nullptr,
     ""},
    {"TensorBoardOptions::stats", "tensorboard.stats", "",
     TT_SET(set_tensorboard_field(o, [&](TensorBoardOptions& tb) { tb.stats(t.list()); })), nullptr, ""},
    {"dump_on", "dump_on", "dump_on", nullptr, TT_JSON(append_dump_on(j, o)),
     "set in code (Options::dump_on(Trigger))"},
    {"hdf5", "", "hdf5", nullptr, json_hdf5, "a struct: its fields are keys of their own (hdf5.deflate, ...)"},
    {"Hdf5Options::deflate", "hdf5.deflate", "",
     TT_SET(o.hdf5().deflate(static_cast<int>(std::min<std::int64_t>(t.integer(), 1 << 20)))), nullptr, ""},
    {"Hdf5Options::shuffle", "hdf5.shuffle", "", TT_SET(o.hdf5().shuffle(t.boolean())), nullptr, ""},
    {"Hdf5Options::chunk_bytes", "hdf5.chunk_bytes", "", TT_SET(o.hdf5().chunk_bytes(t.size())), nullptr, ""},
    {"Hdf5Options::flush_every", "hdf5.flush_every", "", TT_SET(o.hdf5().flush_every(t.integer())), nullptr, ""},
    {"packed", "", "packed", nullptr, json_packed, "a struct: its field is a key of its own (packed.segment_bytes)"},
    {"PackedOptions::segment_bytes", "packed.segment_bytes", "", TT_SET(o.packed().segment_bytes(t.size())), nullptr,
     ""},
    {"max_bytes", "max_bytes", "max_bytes", TT_SET(o.max_bytes(t.size())), TT_NUMBER(max_bytes), ""},
    {"on_budget", "on_budget", "on_budget", TT_SET(o.on_budget(word<Budget>(t))), TT_WORD(on_budget), ""},
    {"dumps_percent", "dumps_percent", "dumps_percent",
     TT_SET(o.dumps_percent(static_cast<int>(std::min<std::int64_t>(t.integer(), 1000)))), TT_NUMBER(dumps_percent),
     ""},
    {"stall_after", "stall_after", "stall_after_ms", TT_SET(o.stall_after(t.duration())),
     TT_JSON(j += fmt::format("{}", o.stall_after().count())), ""},
    // run.json says these at its top ("rank", "world_size"), as placed.
    {"rank", "rank", "", TT_SET(o.rank(t.integer())), nullptr, ""},
    {"world_size", "world_size", "", TT_SET(o.world_size(t.integer())), nullptr, ""},
  };
  return *table;
}

#undef TT_SET
#undef TT_JSON
#undef TT_STRING
#undef TT_NUMBER
#undef TT_BOOL
#undef TT_WORD

}  // namespace

std::string lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return s;
}

std::string trim(const std::string& s) {
  const std::size_t a = s.find_first_not_of(" \t\r\n");
  if (a == std::string::npos) return "";
  return s.substr(a, s.find_last_not_of(" \t\r\n") - a + 1);
}

void OptionText::bad(const std::string& why) const { fail("{}: {}={}: {}", source, key, value, why); }

std::int64_t OptionText::integer() const {
  return static_cast<std::int64_t>(unsigned_int(*this, value, "a non-negative integer"));
}

bool OptionText::boolean() const {
  const std::string v = lower(value);
  if (v == "1" || v == "true" || v == "on") return true;
  if (v == "0" || v == "false" || v == "off") return false;
  bad("expected a boolean: 1, 0, true, false, on or off");
}

std::size_t OptionText::size() const {
  const std::string l = lower(value);
  std::size_t digits = 0;
  while (digits < l.size() && std::isdigit(static_cast<unsigned char>(l[digits]))) ++digits;
  const std::string unit = l.substr(digits);
  int shift = -1;
  for (const auto& [name, bits] : {std::pair<const char*, int>{"", 0}, {"k", 10}, {"m", 20}, {"g", 30}, {"t", 40},
                                   {"kib", 10}, {"mib", 20}, {"gib", 30}, {"tib", 40}})
    if (unit == name) shift = bits;
  if (shift < 0) bad("expected a size: a number of bytes, or with K, M, G or T (powers of 1024)");
  const std::uint64_t n = unsigned_int(*this, l.substr(0, digits), "a size: a number of bytes, or with K, M, G or T");
  if (n > (static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max()) >> shift))
    bad("too large (at most 2^63 - 1 bytes)");
  return static_cast<std::size_t>(n << shift);
}

std::chrono::milliseconds OptionText::duration() const {
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
  const std::uint64_t n = unsigned_int(*this, l.substr(0, digits), "a duration: a number with ms, s, m or h");
  // A watchdog past a year is a typo, and the clock stays far from overflowing.
  constexpr std::uint64_t kYearMs = 365ULL * 24 * 3'600'000;
  if (n > kYearMs / per) bad("longer than a year");
  return std::chrono::milliseconds(static_cast<std::int64_t>(n * per));
}

std::vector<std::string> OptionText::list() const {
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

std::vector<std::int64_t> OptionText::integers() const {
  std::vector<std::int64_t> out;
  for (const std::string& s : list())
    out.push_back(static_cast<std::int64_t>(unsigned_int(*this, s, "non-negative integers joined by '+'")));
  return out;
}

Kind OptionText::kind(const std::string& name) const {
  for (Kind k : kAllKinds)
    if (name == kind_name(k)) return k;
  bad(fmt::format("'{}' is not a kind (activation, activation_grad, param, buffer, grad, tensor)", name));
}

const std::vector<EnumWord<Format>>& words(Format) {
  static const auto* const w = new std::vector<EnumWord<Format>>{
      {"npy", Format::Npy}, {"hdf5", Format::Hdf5}, {"packed", Format::Packed}};
  return *w;
}
const std::vector<EnumWord<Overflow>>& words(Overflow) {
  static const auto* const w = new std::vector<EnumWord<Overflow>>{{"block", Overflow::Block}, {"drop_newest", Overflow::DropNewest}};
  return *w;
}
const std::vector<EnumWord<OnError>>& words(OnError) {
  static const auto* const w = new std::vector<EnumWord<OnError>>{{"continue", OnError::Continue}, {"stop", OnError::Stop}};
  return *w;
}
const std::vector<EnumWord<AfterDump>>& words(AfterDump) {
  static const auto* const w = new std::vector<EnumWord<AfterDump>>{
      {"continue", AfterDump::Continue}, {"stop_capture", AfterDump::StopCapture}, {"throw", AfterDump::Throw}};
  return *w;
}
const std::vector<EnumWord<Budget>>& words(Budget) {
  static const auto* const w = new std::vector<EnumWord<Budget>>{{"stop_capture", Budget::StopCapture},
                                                  {"keep_latest", Budget::KeepLatest}};
  return *w;
}

const std::vector<OptionRow>& option_table() { return rows(); }

const OptionRow* option_row(const std::string& env_key) {
  for (const OptionRow& r : rows()) {
    const std::string key = r.env_key;
    if (key.empty()) continue;
    if (key == env_key) return &r;
    // every.<kind>: any kind's name after the prefix (the kind is checked
    // when the value is set).
    if (key == "every.<kind>" && env_key.rfind("every.", 0) == 0) return &r;
  }
  return nullptr;
}

void append_options_json(std::string& j, const Options& o, int indent) {
  const std::string pad(static_cast<std::size_t>(indent), ' ');
  j += "{";
  bool first = true;
  std::string value;
  for (const OptionRow& r : rows()) {
    if (r.to_json == nullptr || *r.json_key == '\0') continue;
    value.clear();
    if (!r.to_json(value, o)) continue;
    j += fmt::format("{}\n{}\"{}\": {}", first ? "" : ",", pad, r.json_key, value);
    first = false;
  }
  j += "\n" + pad.substr(2) + "}";
}

}  // namespace tensortap::detail
