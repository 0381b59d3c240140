#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "sdk/src/run/control_request.h"
#include "sdk/src/core/pattern.h"
#include "writers/src/file.h"

namespace tensortap::detail {

/// The control channel of one rank's run (`tensortap ctl`; the
/// protocol in docs/leaving-it-on.md): requests are files in
/// `<run>/control/`, answered by lines of `<run>/control.jsonl`; a
/// heartbeat in `<run>/control.heartbeat` says the recorder is alive.
///
/// The writer thread polls (at most twice a second): it answers dump and
/// status itself, and queues capture, every, pause and resume for the
/// training thread's next step(), which applies them and hands the answers
/// back. Everything is inside the run directory, by descriptor, and never
/// through a link; control/ must be the recorder's own (a directory it made,
/// or one of this user's, mode 0700) or the channel is off.
class ControlChannel {
 public:
  /// What the writer thread's poll needs of the rest of the back end.
  struct Hooks {
    /// The step in progress (-1 before the first).
    std::function<std::int64_t()> step;
    /// A dump now, with reason "request"; returns its answer's message.
    std::function<std::string(std::int64_t step)> dump;
    /// The status line's text after "ok at step <s>: ".
    std::function<std::string()> status;
    /// control.jsonl rolls to control.1.jsonl past this size (docs/design.md,
    /// "Leaving it on": a 64th of a disk budget, 64 KiB at least; 1 MiB without).
    std::uint64_t roll_bytes = 1 << 20;
  };

  /// Makes `control/` (0700) in `run` or takes the one there if it is the
  /// recorder's own, emptied; anything else turns the channel off with one
  /// warning on stderr naming the path (the heartbeat says so too, for ctl).
  /// `run_id` is run.json's.
  ControlChannel(const Dir& run, std::string run_id, Hooks hooks);
  bool on() const { return off_why_.empty(); }
  ~ControlChannel();
  ControlChannel(const ControlChannel&) = delete;
  ControlChannel& operator=(const ControlChannel&) = delete;

  /// Writer thread, at each wake: the heartbeat, the answers the training
  /// thread handed back, and, at most twice a second, the requests.
  /// Never throws: a channel that fails says so once and goes off.
  void wake(std::chrono::steady_clock::time_point now);

  /// Training thread: whether requests wait for its step() (one relaxed
  /// load), and taking them.
  bool pending() const { return pending_.load(std::memory_order_relaxed); }
  std::vector<ControlRequest> take();
  /// Training thread: the answers of what it applied, for the writer to
  /// write.
  void answered(std::vector<ControlAnswer> answers);

  /// After the writer thread has stopped: the requests still waiting are
  /// refused ("the run closed"), and the heartbeat stops.
  void close() noexcept;

 private:
  void poll(std::chrono::steady_clock::time_point now);
  void take_file(const std::string& name, double now_unix);
  void write(const ControlAnswer& a);
  void beat(std::chrono::steady_clock::time_point now) noexcept;
  // Makes or takes control/ and control.jsonl; off_why_ says why not.
  void open(const Dir& run);
  // A failure of the channel's own files: said once, and the channel goes off.
  void failed(const std::string& what) noexcept;
  // close(): what was handed back is written, what waits is refused.
  void answer_the_rest() noexcept;

  const Dir& run_;
  const std::string run_id_;
  const Hooks hooks_;
  std::string off_why_;  // "" while on
  Dir control_;
  File answers_;
  std::uint64_t answers_size_ = 0;
  File heartbeat_;
  std::int64_t beats_ = 0;
  std::chrono::steady_clock::time_point last_poll_{}, last_beat_{};
  // Names in control/ that could not be removed (a directory with files):
  // answered once, not again at every poll.
  std::set<std::string> stuck_;

  std::mutex mu_;
  std::vector<ControlRequest> queued_;      // for step(), under mu_
  std::vector<ControlAnswer> answered_;     // from step(), under mu_
  std::atomic<bool> pending_{false};
};

}  // namespace tensortap::detail
