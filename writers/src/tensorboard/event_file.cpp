#include "writers/src/tensorboard/event_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>

#include <fmt/format.h>

#include "writers/src/tensorboard/events.h"

namespace tensortap::detail {
namespace {

double wall_seconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

std::string host_name() {
  char buf[256] = {};
  if (::gethostname(buf, sizeof buf - 1) != 0 || buf[0] == '\0') return "localhost";
  return buf;
}

}  // namespace

std::string event_file_name(std::int64_t unix_seconds, const std::string& host, std::int64_t pid) {
  std::string h = host.empty() ? "localhost" : host;
  // TensorBoard splits the name at dots; a path separator must not get in.
  for (char& c : h) {
    const bool keep = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '-';
    if (!keep) c = '_';
  }
  return fmt::format("events.out.tfevents.{:010d}.{}.{}.tensortap", unix_seconds, h, pid);
}

EventFile::EventFile(const Dir& dir, std::int64_t after_seconds) {
  const double now = wall_seconds();
  seconds_ = std::max(static_cast<std::int64_t>(now), after_seconds + 1);
  name_ = event_file_name(seconds_, host_name(), ::getpid());
  // O_EXCL with Dir's O_NOFOLLOW: a file or link already there is refused,
  // never followed or appended to.
  file_ = dir.open_file(name_, O_WRONLY | O_CREAT | O_EXCL | O_APPEND);
  append(tb::file_version_event(now));
  flush(/*durable=*/false);
}

void EventFile::append(const std::string& event) { tb::append_framed(pending_, event); }

void EventFile::flush(bool durable) {
  if (!pending_.empty()) {
    std::string batch;
    batch.swap(pending_);
    try {
      file_.write_all(batch.data(), batch.size());
    } catch (...) {
      // A short write leaves a torn event, which would end TensorBoard's
      // reading of the file there: cut it off, so later events still count.
      try {
        file_.truncate(size_);
      } catch (...) {
      }
      throw;
    }
    size_ += batch.size();
  }
  if (durable) file_.datasync();
}

void EventFile::close() { file_.close(); }

}  // namespace tensortap::detail
