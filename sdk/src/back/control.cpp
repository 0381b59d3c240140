#include "sdk/src/back/control.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>

#include <fmt/format.h>

#include "writers/src/json.h"

namespace tensortap::detail {
namespace {

// Polls of control/ at most this often: a request waits at most this long
// (plus a step) to be taken, and an idle job pays two directory reads a
// second.
constexpr std::chrono::milliseconds kPollEvery{500};
// The heartbeat's period; ctl calls a run live when it changes within 3 s.
constexpr std::chrono::milliseconds kBeatEvery{1000};
// Requests taken per poll, and the most that may wait in control/: beyond
// it, the rest are refused, so 10,000 planted requests cost one pass.
constexpr std::size_t kTakenPerPoll = 64;
constexpr std::size_t kMaxWaiting = 1024;
// The heartbeat's fixed size: rewritten in place, never shorter, so a reader
// sees a whole line or its previous one padded.
constexpr std::size_t kBeatBytes = 256;

double unix_now() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

std::string host_name() {
  char h[256] = {};
  if (::gethostname(h, sizeof(h) - 1) != 0) return "";
  return h;
}

}  // namespace

ControlChannel::ControlChannel(const Dir& run, std::string run_id, Hooks hooks)
    : run_(run), run_id_(std::move(run_id)), hooks_(std::move(hooks)) {
  // The heartbeat first: it also says when the channel is off, so that ctl
  // can tell "no control channel" from "no live recorder".
  try {
    heartbeat_ = run.open_file("control.heartbeat", O_WRONLY | O_CREAT | O_NOFOLLOW | O_CLOEXEC);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "tensortap: warning: %s: no heartbeat, tensortap ctl cannot reach this run\n", e.what());
  }
  open(run);
  beat(std::chrono::steady_clock::now());
}

void ControlChannel::open(const Dir& run) {
  const std::string path = run.path_of("control");
  const auto off = [&](const std::string& why) {
    off_why_ = why;
    std::fprintf(stderr, "tensortap: warning: %s: the control channel is off (tensortap ctl cannot reach this run)\n",
                 why.c_str());
  };
  bool made = ::mkdirat(run.fd(), "control", 0700) == 0;
  if (!made && errno != EEXIST) {
    off(fmt::format("cannot create '{}': {}", path, std::strerror(errno)));
    return;
  }
  struct stat st {};
  if (::fstatat(run.fd(), "control", &st, AT_SYMLINK_NOFOLLOW) != 0 || !S_ISDIR(st.st_mode)) {
    off(fmt::format("'{}' is not a directory (a symbolic link or a file planted there?)", path));
    return;
  }
  if (st.st_uid != ::geteuid() || (!made && (st.st_mode & 077) != 0)) {
    off(fmt::format("'{}' is not the recorder's own (owner {}, mode {:o}); it is left as it is", path, st.st_uid,
                    st.st_mode & 0777));
    return;
  }
  const int fd = ::openat(run.fd(), "control", O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) {
    off(fmt::format("cannot open '{}': {}", path, std::strerror(errno)));
    return;
  }
  ::close(fd);
  try {
    control_ = run.sub("control", false);
    // The recorder's own, from an earlier run in this directory: emptied of
    // its requests (and of what else lies there: nothing follows a link).
    for (const std::string& name : control_.list()) {
      if (::unlinkat(control_.fd(), name.c_str(), 0) != 0 && errno == EISDIR)
        ::unlinkat(control_.fd(), name.c_str(), AT_REMOVEDIR);
    }
    answers_ = run.open_file("control.jsonl", O_WRONLY | O_CREAT | O_APPEND | O_NOFOLLOW | O_CLOEXEC);
    struct stat st {};
    if (::fstat(answers_.fd(), &st) == 0) answers_size_ = static_cast<std::uint64_t>(st.st_size);
  } catch (const std::exception& e) {
    off(e.what());
  }
}

ControlChannel::~ControlChannel() = default;

void ControlChannel::failed(const std::string& what) noexcept {
  if (!off_why_.empty()) return;
  off_why_ = what;
  std::fprintf(stderr, "tensortap: warning: %s: the control channel goes off\n", what.c_str());
}

void ControlChannel::wake(std::chrono::steady_clock::time_point now) {
  if (now - last_beat_ >= kBeatEvery) beat(now);
  if (!off_why_.empty()) return;
  std::vector<ControlAnswer> applied;
  try {
    {
      std::lock_guard<std::mutex> lock(mu_);
      applied.swap(answered_);
    }
    for (const ControlAnswer& a : applied) write(a);
    if (now - last_poll_ >= kPollEvery) {
      last_poll_ = now;
      poll(now);
    }
  } catch (const std::exception& e) {
    failed(e.what());
  } catch (...) {
    failed("the control channel failed");
  }
}

void ControlChannel::beat(std::chrono::steady_clock::time_point now) noexcept {
  last_beat_ = now;
  if (!heartbeat_) return;
  try {
    std::string line;
    line += fmt::format("{{\"pid\": {}, \"beat\": {}, \"step\": {}, \"time\": {:.3f}, \"channel\": ",
                        static_cast<long>(::getpid()), ++beats_, hooks_.step(), unix_now());
    append_json_string(line, off_why_.empty() ? std::string("on") : "off: " + off_why_);
    line += ", \"host\": ";
    append_json_string(line, host_name());
    line += "}";
    // Fixed-size, rewritten in place: a reader sees a whole line or the
    // previous one. Too long (a host name of 200 bytes): the line is not
    // cut, the padding is dropped; ctl reads it all the same.
    if (line.size() + 1 < kBeatBytes) line.resize(kBeatBytes - 1, ' ');
    line += '\n';
    heartbeat_.pwrite_all(line.data(), line.size(), 0);
  } catch (...) {
    heartbeat_.close();  // said nowhere else: ctl will say "no live recorder"
  }
}

void ControlChannel::write(const ControlAnswer& a) {
  std::string line = "{\"id\": ";
  append_json_string(line, a.id);
  line += ", \"command\": ";
  append_json_string(line, a.command);
  line += a.ok ? ", \"status\": \"ok\", \"step\": " : ", \"status\": \"refused\", \"step\": ";
  line += a.step >= 0 ? std::to_string(a.step) : std::string("null");
  line += ", \"message\": ";
  append_json_string(line, a.message);
  line += "}\n";
  // Past its size, control.jsonl becomes control.1.jsonl (the older one
  // goes) and a new one begins: a flood of requests cannot grow the run
  // without bound. ctl reads on in the new file once the name moved.
  if (answers_size_ > 0 && answers_size_ + line.size() > hooks_.roll_bytes) {
    run_.rename("control.jsonl", "control.1.jsonl");
    answers_ = run_.open_file("control.jsonl", O_WRONLY | O_CREAT | O_EXCL | O_APPEND | O_NOFOLLOW | O_CLOEXEC);
    answers_size_ = 0;
  }
  // One write of a whole line to a file opened O_APPEND: two recorders
  // never share a run, and ctl reads only whole lines.
  answers_.write_all(line.data(), line.size());
  answers_size_ += line.size();
}

void ControlChannel::poll(std::chrono::steady_clock::time_point) {
  std::vector<std::string> names;
  for (std::string& name : control_.list())
    if (is_request_file_name(name) && stuck_.count(name) == 0) names.push_back(std::move(name));
  // In name order: ctl's ids begin with the time, so the oldest first.
  std::sort(names.begin(), names.end());
  const double now_unix = unix_now();
  for (std::size_t i = 0; i < names.size(); ++i) {
    if (i >= kMaxWaiting) {
      ControlAnswer a;
      a.id = names[i].substr(0, names[i].size() - 5);
      a.message = fmt::format("too many pending requests (more than {})", kMaxWaiting);
      if (::unlinkat(control_.fd(), names[i].c_str(), 0) == 0) write(a);
      continue;
    }
    if (i < kTakenPerPoll) take_file(names[i], now_unix);
  }
}

void ControlChannel::take_file(const std::string& name, double now_unix) {
  ControlAnswer a;
  a.id = name.substr(0, name.size() - 5);
  const auto refuse = [&](std::string why) {
    a.message = std::move(why);
    write(a);
  };
  const auto remove = [&] {
    if (::unlinkat(control_.fd(), name.c_str(), 0) == 0) return true;
    if (errno == EISDIR && ::unlinkat(control_.fd(), name.c_str(), AT_REMOVEDIR) == 0) return true;
    if (errno == ENOENT) return true;  // withdrawn by ctl meanwhile
    stuck_.insert(name);
    return false;
  };
  // Never through a link, never waiting on a FIFO or a device.
  const int fd = ::openat(control_.fd(), name.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ENOENT) return;  // withdrawn
    const int err = errno;
    remove();
    refuse(err == ELOOP ? "a symbolic link, not a request: refused unread"
                        : fmt::format("cannot be opened: {}", std::strerror(err)));
    return;
  }
  File file(fd, control_.path_of(name));
  const struct stat st = file.status();
  if (!S_ISREG(st.st_mode)) {
    remove();
    refuse("not a regular file: refused unread");
    return;
  }
  // Judged by its size before a byte is read: a sparse file of a GiB costs
  // nothing.
  if (st.st_size > static_cast<off_t>(kMaxRequestBytes)) {
    remove();
    refuse(fmt::format("{} bytes, more than {} a request may hold: refused unread", st.st_size, kMaxRequestBytes));
    return;
  }
  std::string text(kMaxRequestBytes + 1, '\0');
  text.resize(file.pread_upto(text.data(), text.size(), 0));
  file.close();
  if (!remove()) {
    refuse("it could not be removed from control/: refused");
    return;
  }
  if (text.size() > kMaxRequestBytes) {
    refuse(fmt::format("more than {} bytes: refused", kMaxRequestBytes));
    return;
  }
  auto parsed = parse_control_request(text, a.id, run_id_, now_unix);
  if (auto* no = std::get_if<ControlRefusal>(&parsed)) {
    a.command = no->command;
    refuse(no->why);
    return;
  }
  ControlRequest& r = std::get<ControlRequest>(parsed);
  a.command = control_command_name(r.command);
  if (r.command == ControlCommand::Dump || r.command == ControlCommand::Status) {
    // Answered here, between steps too: the step in progress.
    a.ok = true;
    a.step = hooks_.step();
    a.message = r.command == ControlCommand::Dump ? hooks_.dump(a.step) : hooks_.status();
    if (a.step < 0) {
      a.ok = false;
      a.message = "the run has not begun a step yet";
    }
    write(a);
    return;
  }
  std::lock_guard<std::mutex> lock(mu_);
  queued_.push_back(std::move(r));
  pending_.store(true, std::memory_order_relaxed);
}

std::vector<ControlRequest> ControlChannel::take() {
  std::lock_guard<std::mutex> lock(mu_);
  pending_.store(false, std::memory_order_relaxed);
  std::vector<ControlRequest> out;
  out.swap(queued_);
  return out;
}

void ControlChannel::answered(std::vector<ControlAnswer> answers) {
  std::lock_guard<std::mutex> lock(mu_);
  for (ControlAnswer& a : answers) answered_.push_back(std::move(a));
}

void ControlChannel::close() noexcept {
  if (off_why_.empty()) answer_the_rest();
  off_why_ = "closed";
  // The front end (and so this) may live on with the model's hooks: no
  // descriptor is kept past close().
  control_.close();
  answers_.close();
  heartbeat_.close();
}

void ControlChannel::answer_the_rest() noexcept {
  try {
    std::vector<ControlAnswer> done;
    std::vector<ControlRequest> left;
    {
      std::lock_guard<std::mutex> lock(mu_);
      done.swap(answered_);
      left.swap(queued_);
      pending_.store(false, std::memory_order_relaxed);
    }
    for (const ControlAnswer& a : done) write(a);
    for (const ControlRequest& r : left) {
      ControlAnswer a;
      a.id = r.id;
      a.command = control_command_name(r.command);
      a.message = "the run was closed before its next step()";
      write(a);
    }
    // What still waits in control/ gets the same answer now, not a timeout.
    for (const std::string& name : control_.list()) {
      if (!is_request_file_name(name) || stuck_.count(name) != 0) continue;
      if (::unlinkat(control_.fd(), name.c_str(), 0) != 0) continue;
      ControlAnswer a;
      a.id = name.substr(0, name.size() - 5);
      a.message = "the run was closed";
      write(a);
    }
  } catch (...) {
  }
}

}  // namespace tensortap::detail
