#include "sdk/src/run/control_request.h"

#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <map>
#include <optional>
#include <vector>

#include <fmt/format.h>

#include <tensortap/kinds.h>

#include "sdk/src/core/pattern.h"
#include "writers/src/json.h"
#include "writers/src/kind_set_access.h"

namespace tensortap::detail {
namespace {

// The largest step count or period a request may ask: past it, a step
// number of 2^47 (kMaxStep) is reached anyway.
constexpr std::int64_t kMaxSteps = std::int64_t{1} << 40;
// A request's id, its file's name without ".json".
constexpr std::size_t kMaxIdBytes = 64;

// A JSON value of the request's grammar: a string, a number (kept as its
// text, so an integer is judged exactly), or an array of strings.
struct Value {
  enum class Type { String, Number, Strings } type = Type::String;
  std::string text;
  std::vector<std::string> strings;
};

struct Refused {
  std::string why;
};

// A strict reader of one flat JSON object: what a request may hold, and
// nothing else (no nesting but an array of strings, no true/false/null).
class Reader {
 public:
  explicit Reader(std::string_view s) : s_(s) {}

  std::map<std::string, Value> object() {
    std::map<std::string, Value> out;
    space();
    expect('{');
    space();
    if (peek() == '}') {
      ++i_;
    } else {
      for (;;) {
        space();
        std::string key = string();
        space();
        expect(':');
        space();
        Value v = value(key);
        if (!out.emplace(key, std::move(v)).second) throw Refused{fmt::format("key '{}' appears twice", key)};
        space();
        if (peek() == ',') {
          ++i_;
          continue;
        }
        expect('}');
        break;
      }
    }
    space();
    if (i_ != s_.size()) throw Refused{"bytes after the JSON object"};
    return out;
  }

 private:
  char peek() const { return i_ < s_.size() ? s_[i_] : '\0'; }
  void space() {
    while (i_ < s_.size() && (s_[i_] == ' ' || s_[i_] == '\t' || s_[i_] == '\n' || s_[i_] == '\r')) ++i_;
  }
  void expect(char c) {
    if (peek() != c) throw Refused{fmt::format("not a JSON object of the request's form: expected '{}' at byte {}", c, i_)};
    ++i_;
  }

  Value value(const std::string& key) {
    Value v;
    const char c = peek();
    if (c == '"') {
      v.text = string();
    } else if (c == '-' || (c >= '0' && c <= '9')) {
      v.type = Value::Type::Number;
      v.text = number();
    } else if (c == '[') {
      v.type = Value::Type::Strings;
      ++i_;
      space();
      if (peek() == ']') {
        ++i_;
        return v;
      }
      for (;;) {
        space();
        if (peek() != '"') throw Refused{fmt::format("'{}' must be an array of strings", key)};
        v.strings.push_back(string());
        space();
        if (peek() == ',') {
          ++i_;
          continue;
        }
        expect(']');
        break;
      }
    } else {
      throw Refused{fmt::format("'{}' has a value of a type no request takes", key)};
    }
    return v;
  }

  // JSON's number grammar, kept as text.
  std::string number() {
    const std::size_t start = i_;
    if (peek() == '-') ++i_;
    if (peek() == '0') {
      ++i_;
    } else {
      if (!(peek() >= '1' && peek() <= '9')) throw Refused{"a malformed number"};
      while (peek() >= '0' && peek() <= '9') ++i_;
    }
    if (peek() == '.') {
      ++i_;
      if (!(peek() >= '0' && peek() <= '9')) throw Refused{"a malformed number"};
      while (peek() >= '0' && peek() <= '9') ++i_;
    }
    if (peek() == 'e' || peek() == 'E') {
      ++i_;
      if (peek() == '+' || peek() == '-') ++i_;
      if (!(peek() >= '0' && peek() <= '9')) throw Refused{"a malformed number"};
      while (peek() >= '0' && peek() <= '9') ++i_;
    }
    return std::string(s_.substr(start, i_ - start));
  }

  std::string string() {
    std::string out;
    const std::string problem = read_json_string(s_, i_, out, /*utf8=*/true, /*surrogateescape=*/false);
    if (!problem.empty()) throw Refused{problem};
    return out;
  }

  std::string_view s_;
  std::size_t i_ = 0;
};

const Value& need(const std::map<std::string, Value>& m, const char* key) {
  const auto it = m.find(key);
  if (it == m.end()) throw Refused{fmt::format("no '{}'", key)};
  return it->second;
}

const std::string& need_string(const std::map<std::string, Value>& m, const char* key) {
  const Value& v = need(m, key);
  if (v.type != Value::Type::String) throw Refused{fmt::format("'{}' must be a string", key)};
  return v.text;
}

// An integer in [lo, hi], written as one (no fraction, no exponent).
std::int64_t need_int(const std::map<std::string, Value>& m, const char* key, std::int64_t lo, std::int64_t hi) {
  const Value& v = need(m, key);
  if (v.type != Value::Type::Number || v.text.find_first_of(".eE") != std::string::npos)
    throw Refused{fmt::format("'{}' must be an integer", key)};
  errno = 0;
  char* end = nullptr;
  const long long n = std::strtoll(v.text.c_str(), &end, 10);
  if (errno != 0 || n < lo || n > hi)
    throw Refused{fmt::format("'{}' is {}: it must be from {} to {}", key, v.text, lo, hi)};
  return n;
}

std::optional<Kind> kind_named(const std::string& name) {
  for (Kind k : kAllKinds)
    if (name == kind_name(k)) return k;
  return std::nullopt;
}

ControlRequest checked(const std::map<std::string, Value>& m, const std::string& file_id, const std::string& run_id,
                       double now, std::string& command_seen) {
  const std::string& command = need_string(m, "command");
  ControlRequest r;
  std::vector<const char*> allowed = {"id", "run", "command", "expires"};
  if (command == "dump") {
    r.command = ControlCommand::Dump;
  } else if (command == "status") {
    r.command = ControlCommand::Status;
  } else if (command == "pause") {
    r.command = ControlCommand::Pause;
  } else if (command == "resume") {
    r.command = ControlCommand::Resume;
  } else if (command == "every") {
    r.command = ControlCommand::Every;
    allowed.push_back("every");
  } else if (command == "capture") {
    r.command = ControlCommand::Capture;
    allowed.insert(allowed.end(), {"steps", "kinds", "include"});
  } else {
    throw Refused{"unknown command (expected dump, capture, every, pause, resume or status)"};
  }
  command_seen = command;
  for (const auto& [key, value] : m) {
    bool ok = false;
    for (const char* a : allowed) ok = ok || key == a;
    if (!ok) throw Refused{fmt::format("unknown key '{}' for {}", key, command)};
  }
  r.id = need_string(m, "id");
  if (r.id != file_id) throw Refused{fmt::format("its id is not its file's name ({}.json)", file_id)};
  if (need_string(m, "run") != run_id)
    throw Refused{"it names another run (its 'run' is not this run's run_id in run.json)"};
  const Value& expires = need(m, "expires");
  if (expires.type != Value::Type::Number) throw Refused{"'expires' must be a number (seconds since the epoch)"};
  const double when = std::strtod(expires.text.c_str(), nullptr);
  if (!std::isfinite(when) || when <= now) throw Refused{"it has expired"};
  if (r.command == ControlCommand::Every) r.every = need_int(m, "every", 0, kMaxSteps);
  if (r.command == ControlCommand::Capture) {
    r.steps = need_int(m, "steps", 1, kMaxSteps);
    if (const auto it = m.find("kinds"); it != m.end()) {
      if (it->second.type != Value::Type::Strings || it->second.strings.empty())
        throw Refused{"'kinds' must be a non-empty array of kind names"};
      for (const std::string& name : it->second.strings) {
        const std::optional<Kind> k = kind_named(name);
        if (!k) throw Refused{fmt::format("'kinds' names no kind '{}'", name)};
        r.kinds |= KindSetAccess::bit(*k);
      }
    }
    if (const auto it = m.find("include"); it != m.end()) {
      if (it->second.type != Value::Type::String || it->second.text.empty())
        throw Refused{"'include' must be a non-empty string"};
      r.include = it->second.text;
      try {
        const Pattern compiled(r.include, "include");
        (void)compiled;
      } catch (const std::exception& e) {
        throw Refused{e.what()};
      }
    }
  }
  return r;
}

}  // namespace

const char* control_command_name(ControlCommand c) {
  switch (c) {
    case ControlCommand::Dump: return "dump";
    case ControlCommand::Capture: return "capture";
    case ControlCommand::Every: return "every";
    case ControlCommand::Pause: return "pause";
    case ControlCommand::Resume: return "resume";
    case ControlCommand::Status: return "status";
  }
  return "?";
}

bool is_request_file_name(const std::string& name) {
  constexpr std::string_view suffix = ".json";
  if (name.size() <= suffix.size() || name.size() > kMaxIdBytes + suffix.size()) return false;
  if (name.compare(name.size() - suffix.size(), suffix.size(), suffix) != 0) return false;
  for (std::size_t i = 0; i + suffix.size() < name.size(); ++i) {
    const char c = name[i];
    if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '-'))
      return false;
  }
  return true;
}

std::variant<ControlRequest, ControlRefusal> parse_control_request(std::string_view text, const std::string& file_id,
                                                                   const std::string& run_id, double now) {
  std::string command;
  try {
    Reader reader(text);
    return checked(reader.object(), file_id, run_id, now, command);
  } catch (const Refused& r) {
    return ControlRefusal{command, r.why};
  }
}

}  // namespace tensortap::detail
