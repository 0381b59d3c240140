#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <variant>

namespace tensortap::detail {

/// What `tensortap ctl` can ask of a running recorder (docs/leaving-it-on.md).
enum class ControlCommand { Dump, Capture, Every, Pause, Resume, Status };

/// The name `ctl` and control.jsonl use: "dump", "capture", ...
const char* control_command_name(ControlCommand c);

/// One request, checked: the writer thread parses it, and the training
/// thread applies capture, every, pause and resume at its next step().
struct ControlRequest {
  std::string id;
  ControlCommand command = ControlCommand::Status;
  /// capture: how many steps, from the next; the kinds (bits of
  /// KindSetAccess, 0: the recorder's own); an include pattern ("": the
  /// recorder's own).
  std::int64_t steps = 0;
  std::uint64_t kinds = 0;
  std::string include;
  /// every: the period from the next step (0: no full tensors).
  std::int64_t every = 0;
};

/// An answer to a request: a line of control.jsonl.
struct ControlAnswer {
  std::string id;
  std::string command;  // "" when the request was refused before its command was known
  bool ok = false;
  std::int64_t step = -1;  // the first step it is in effect (-1: none, null in the line)
  std::string message;
};

/// At most this many bytes a request file may hold: a larger one is refused
/// unread.
constexpr std::size_t kMaxRequestBytes = 4096;

/// A request refused: why, and the command when it was known ("" if not).
struct ControlRefusal {
  std::string command;
  std::string why;
};

/// Parses a request file's bytes strictly (docs/leaving-it-on.md, "The
/// request"): one JSON object with exactly the keys its command takes;
/// `id` must be `file_id` (the file's name without ".json"), `run` the
/// run's id, and `expires` (seconds since the epoch) after `now`. Anything
/// else is refused, by name: an unknown key, a value of the wrong type or
/// range, a second value for a key, trailing bytes.
std::variant<ControlRequest, ControlRefusal> parse_control_request(std::string_view text, const std::string& file_id,
                                                                   const std::string& run_id, double now);

/// Whether `name` is a request's file name: 1 to 64 of [A-Za-z0-9_-], then
/// ".json". Anything else in control/ (ctl's temporaries start with '.')
/// is not a request.
bool is_request_file_name(const std::string& name);

}  // namespace tensortap::detail
