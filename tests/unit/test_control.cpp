// tensortap ctl's channel in the recorder (issue 60, DESIGN section 10):
// requests in <run>/control/ parsed strictly, answered in control.jsonl,
// applied at the next step(); and what a hostile run directory can do to it.
// The command itself is Python's (tests/python/test_ctl.py); here requests
// are written by hand, as a user without Python would.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <functional>
#include <fstream>
#include <string>
#include <thread>
#include <variant>
#include <vector>

#include <ATen/ATen.h>

#include <tensortap/tensortap.h>

#include "tests/support/helpers.h"
#include "sdk/src/back/control.h"
#include "sdk/src/run/control_request.h"

using tensortap::Options;
using tensortap::Recorder;
using tensortap::detail::ControlChannel;
using tensortap::detail::ControlCommand;
using tensortap::detail::ControlRefusal;
using tensortap::detail::ControlRequest;
using tensortap::detail::parse_control_request;
using tt_test::TempDir;

namespace {

const std::string kRun = "0123456789abcdef0123456789abcdef";
constexpr double kNow = 1.8e9;

std::variant<ControlRequest, ControlRefusal> parse(const std::string& text, const std::string& id = "r1") {
  return parse_control_request(text, id, kRun, kNow);
}

std::string refusal(const std::string& text, const std::string& id = "r1") {
  const auto r = parse(text, id);
  REQUIRE(std::holds_alternative<ControlRefusal>(r));
  return std::get<ControlRefusal>(r).why;
}

std::string request(const std::string& command, const std::string& more = "") {
  return "{\"id\": \"r1\", \"run\": \"" + kRun + "\", \"command\": \"" + command + "\", \"expires\": 1.9e9" + more + "}";
}

std::string run_id(const TempDir& dir) {
  const std::string json = tt_test::read_file(dir / "run.json");
  const auto at = json.find("\"run_id\": \"");
  REQUIRE(at != std::string::npos);
  return json.substr(at + 11, 32);
}

double unix_now() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

// Writes control/<id>.json as ctl does: a temporary, then a rename.
void send(const TempDir& dir, const std::string& id, const std::string& body) {
  const std::string tmp = dir / ("control/." + id + ".tmp");
  {
    std::ofstream f(tmp);
    f << body;
  }
  REQUIRE(::rename(tmp.c_str(), (dir / ("control/" + id + ".json")).c_str()) == 0);
}

std::string body(const TempDir& dir, const std::string& id, const std::string& command, const std::string& more = "") {
  return fmt::format("{{\"id\": \"{}\", \"run\": \"{}\", \"command\": \"{}\", \"expires\": {:.3f}{}}}", id,
                     run_id(dir), command, unix_now() + 60, more);
}

// The answer line to `id`, waiting up to `seconds` while `tick` (a step, say)
// runs every 50 ms.
// The answers of both generations, control.1.jsonl (once control.jsonl rolled) first.
std::vector<std::string> answer_lines(const TempDir& dir) {
  std::vector<std::string> out;
  for (const char* name : {"control.1.jsonl", "control.jsonl"})
    if (std::filesystem::exists(dir / name))
      for (std::string& line : tt_test::read_lines(dir / name)) out.push_back(std::move(line));
  return out;
}

std::string answer(const TempDir& dir, const std::string& id, double seconds, const std::function<void()>& tick = {}) {
  const auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  for (;;) {
    for (const std::string& line : answer_lines(dir))
      if (line.find("{\"id\": \"" + id + "\"") == 0) return line;
    if (std::chrono::steady_clock::now() >= until) return "";
    if (tick) tick();
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
}

// The steps of the index's records, one per record, in order.
std::vector<std::int64_t> index_steps(const TempDir& dir) {
  std::vector<std::int64_t> steps;
  if (!std::filesystem::exists(dir / "index.jsonl")) return steps;
  for (const std::string& line : tt_test::read_lines(dir / "index.jsonl"))
    steps.push_back(std::stoll(line.substr(line.find("\"step\":") + 7)));
  std::sort(steps.begin(), steps.end());
  return steps;
}

std::size_t answers(const TempDir& dir) { return answer_lines(dir).size(); }

}  // namespace

TEST_CASE("a request is parsed strictly: each command's keys, types and ranges, or a reason", "[sdk][control]") {
  {
    const auto r = parse(request("capture", ", \"steps\": 5, \"kinds\": [\"grad\", \"param\"], \"include\": \"fc\""));
    REQUIRE(std::holds_alternative<ControlRequest>(r));
    const ControlRequest& c = std::get<ControlRequest>(r);
    CHECK(c.command == ControlCommand::Capture);
    CHECK(c.steps == 5);
    CHECK(c.kinds != 0);
    CHECK(c.include == "fc");
  }
  CHECK(std::get<ControlRequest>(parse(request("every", ", \"every\": 0"))).every == 0);
  CHECK(std::get<ControlRequest>(parse(request("status"))).command == ControlCommand::Status);
  // \u escapes, a surrogate pair included, decode to UTF-8.
  CHECK(std::get<ControlRequest>(parse(request("capture", ", \"steps\": 1, \"include\": \"\\u00e9\\ud83d\\ude00\"")))
            .include == "\xc3\xa9\xf0\x9f\x98\x80");

  CHECK_THAT(refusal(request("reboot")), Catch::Contains("unknown command"));
  CHECK_THAT(refusal(request("status", ", \"steps\": 5")), Catch::Contains("unknown key 'steps' for status"));
  CHECK_THAT(refusal(request("capture")), Catch::Contains("no 'steps'"));
  CHECK_THAT(refusal(request("capture", ", \"steps\": 0")), Catch::Contains("'steps' is 0: it must be from 1"));
  CHECK_THAT(refusal(request("capture", ", \"steps\": 2.5")), Catch::Contains("'steps' must be an integer"));
  CHECK_THAT(refusal(request("capture", ", \"steps\": 1e3")), Catch::Contains("'steps' must be an integer"));
  CHECK_THAT(refusal(request("capture", ", \"steps\": 99999999999999999999")), Catch::Contains("'steps' is"));
  CHECK_THAT(refusal(request("capture", ", \"steps\": \"5\"")), Catch::Contains("'steps' must be an integer"));
  CHECK_THAT(refusal(request("capture", ", \"steps\": 1, \"kinds\": [\"weights\"]")), Catch::Contains("no kind 'weights'"));
  CHECK_THAT(refusal(request("capture", ", \"steps\": 1, \"kinds\": []")), Catch::Contains("non-empty array"));
  CHECK_THAT(refusal(request("capture", ", \"steps\": 1, \"kinds\": [1]")), Catch::Contains("array of strings"));
  CHECK_THAT(refusal(request("capture", ", \"steps\": 1, \"include\": \"(\"")), Catch::Contains("include"));
  CHECK_THAT(refusal(request("every", ", \"every\": -1")), Catch::Contains("'every' is -1"));
  CHECK_THAT(refusal(request("status", ", \"command\": \"dump\"")), Catch::Contains("appears twice"));
  CHECK_THAT(refusal(request("status") + " x"), Catch::Contains("bytes after the JSON object"));
  CHECK_THAT(refusal(request("status"), "r2"), Catch::Contains("not its file's name (r2.json)"));
  CHECK_THAT(refusal("{\"id\": \"r1\", \"run\": \"other\", \"command\": \"status\", \"expires\": 1.9e9}"),
             Catch::Contains("another run"));
  CHECK_THAT(refusal("{\"id\": \"r1\", \"run\": \"" + kRun + "\", \"command\": \"status\", \"expires\": 1.7e9}"),
             Catch::Contains("expired"));
  CHECK_THAT(refusal("{\"id\": \"r1\", \"command\": \"status\", \"expires\": 1.9e9}"), Catch::Contains("no 'run'"));
  CHECK_THAT(refusal("{\"id\": \"r1\", \"run\": true}"), Catch::Contains("a type no request takes"));
  CHECK_THAT(refusal("{\"a\": {\"b\": 1}}"), Catch::Contains("a type no request takes"));
  CHECK_THAT(refusal("[1]"), Catch::Contains("expected '{'"));
  CHECK_THAT(refusal(""), Catch::Contains("expected '{'"));
  CHECK_THAT(refusal("{\"id\": \"r\xff\"}"), Catch::Contains("not UTF-8"));
  CHECK_THAT(refusal("{\"id\": \"\\ud800\"}"), Catch::Contains("lone surrogate"));
  CHECK_THAT(refusal("{\"id\": \"a\nb\"}"), Catch::Contains("control character"));
  CHECK_THAT(refusal("{\"id\": \"ab"), Catch::Contains("does not end"));

  CHECK(tensortap::detail::is_request_file_name("1795886633886-42-ab12cd.json"));
  CHECK_FALSE(tensortap::detail::is_request_file_name(".x.tmp"));
  CHECK_FALSE(tensortap::detail::is_request_file_name(".json"));
  CHECK_FALSE(tensortap::detail::is_request_file_name("../x.json"));
  CHECK_FALSE(tensortap::detail::is_request_file_name(std::string(65, 'a') + ".json"));
}

TEST_CASE("ctl's requests steer a running recorder at its next step, and dump and status are answered between steps",
          "[sdk][control]") {
  TempDir dir;
  Recorder rec{Options(dir.path).every(0).stats_every(1)};
  std::int64_t step = 0;
  const auto tick = [&] {
    rec.step(step);
    rec.capture("x", at::full({4}, static_cast<double>(step)));
    ++step;
  };
  tick();
  // Between steps: status and dump are the writer thread's to answer.
  send(dir, "s1", body(dir, "s1", "status"));
  std::string line = answer(dir, "s1", 5);
  CHECK_THAT(line, Catch::Matches("\\{\"id\": \"s1\", \"command\": \"status\", \"status\": \"ok\", \"step\": 0, "
                                  "\"message\": \"records 0, bytes 0, dropped 0, budget off, last step [0-9.]+ s ago\"\\}"));
  send(dir, "d1", body(dir, "d1", "dump"));
  CHECK_THAT(answer(dir, "d1", 5), Catch::Contains("\"status\": \"ok\", \"step\": 0, \"message\": \"the run is marked"));
  // capture: from the next step, 3 steps in full.
  send(dir, "c1", body(dir, "c1", "capture", ", \"steps\": 3"));
  line = answer(dir, "c1", 5, tick);
  REQUIRE_THAT(line, Catch::Contains("\"status\": \"ok\""));
  const std::int64_t from = std::stoll(line.substr(line.find("\"step\": ") + 8));
  for (int i = 0; i < 6; ++i) tick();
  // every 2, then pause and resume.
  send(dir, "e1", body(dir, "e1", "every", ", \"every\": 2"));
  line = answer(dir, "e1", 5, tick);
  const std::int64_t every_from = std::stoll(line.substr(line.find("\"step\": ") + 8));
  send(dir, "p1", body(dir, "p1", "pause"));
  line = answer(dir, "p1", 5, tick);
  const std::int64_t paused = std::stoll(line.substr(line.find("\"step\": ") + 8));
  send(dir, "p2", body(dir, "p2", "pause"));
  CHECK_THAT(answer(dir, "p2", 5, tick), Catch::Contains("already paused since step"));
  for (int i = 0; i < 3; ++i) tick();
  send(dir, "r1", body(dir, "r1", "resume"));
  line = answer(dir, "r1", 5, tick);
  const std::int64_t resumed = std::stoll(line.substr(line.find("\"step\": ") + 8));
  for (int i = 0; i < 4; ++i) tick();
  rec.close();
  std::vector<std::int64_t> want;
  for (std::int64_t s = from; s < from + 3; ++s) want.push_back(s);
  for (std::int64_t s = every_from; s < step; s += 2)
    if (s < paused || s >= resumed) want.push_back(s);
  std::sort(want.begin(), want.end());
  CHECK(index_steps(dir) == want);
  CHECK_THAT(tt_test::read_file(dir / "dumps.jsonl"), Catch::Contains("\"reason\": \"request\", \"steps\": []"));
}

TEST_CASE("a control/ that is not the recorder's own turns the channel off, with a warning; nothing is followed",
          "[sdk][control][hostile]") {
  // The recorder makes control/ after RunDir has opened (and, with
  // overwrite, emptied) the directory, so what is planted here stands for
  // what a race plants between the two: the channel is made by hand.
  TempDir dir, elsewhere;
  const tensortap::detail::Dir run = tensortap::detail::Dir::open(dir.path, false);
  ControlChannel::Hooks hooks{[] { return std::int64_t{3}; }, [](std::int64_t) { return std::string(); },
                              [] { return std::string(); }};
  SECTION("a symbolic link") {
    REQUIRE(::symlink(elsewhere.path.c_str(), (dir / "control").c_str()) == 0);
    const std::string err = tt_test::stderr_of(elsewhere / "stderr.txt", [&] {
      ControlChannel channel(run, kRun, hooks);
      CHECK_FALSE(channel.on());
      channel.wake(std::chrono::steady_clock::now() + std::chrono::seconds(5));
    });
    CHECK_THAT(err, Catch::Contains("control' is not a directory (a symbolic link or a file planted there?)"));
    CHECK(std::filesystem::is_symlink(dir / "control"));
    CHECK(!std::filesystem::exists(elsewhere / "theirs"));
    CHECK(std::filesystem::directory_iterator(elsewhere.path)->path().filename() == "stderr.txt");  // only
    CHECK_THAT(tt_test::read_file(dir / "control.heartbeat"), Catch::Contains("\"channel\": \"off: "));
  }
  SECTION("a file") {
    std::ofstream(dir / "control") << "x";
    ControlChannel channel(run, kRun, hooks);
    CHECK_FALSE(channel.on());
    CHECK(tt_test::read_file(dir / "control") == "x");
  }
  SECTION("a directory others may write") {
    REQUIRE(::mkdir((dir / "control").c_str(), 0777) == 0);
    REQUIRE(::chmod((dir / "control").c_str(), 0777) == 0);
    std::ofstream(dir / "control/theirs.json") << "{}";
    ControlChannel channel(run, kRun, hooks);
    CHECK_FALSE(channel.on());
    CHECK(std::filesystem::exists(dir / "control/theirs.json"));  // never removed
  }
  SECTION("its own, from an earlier run: emptied") {
    REQUIRE(::mkdir((dir / "control").c_str(), 0700) == 0);
    std::ofstream(dir / "control/old.json") << "{}";
    ControlChannel channel(run, kRun, hooks);
    CHECK(channel.on());
    CHECK(std::filesystem::is_empty(dir / "control"));
  }
}

TEST_CASE("hostile requests: links, FIFOs, a sparse GiB, 10,000 at once; each refused by name, training goes on",
          "[sdk][control][hostile]") {
  TempDir dir, elsewhere;
  Recorder rec{Options(dir.path).every(0).stats_every(1)};
  std::int64_t step = 0;
  const auto tick = [&] { rec.step(step++); };
  tick();
  std::ofstream(elsewhere / "secret.json") << body(dir, "x", "status");
  REQUIRE(::symlink((elsewhere / "secret.json").c_str(), (dir / "control/link.json").c_str()) == 0);
  REQUIRE(::mkfifo((dir / "control/fifo.json").c_str(), 0600) == 0);
  {
    const int fd = ::open((dir / "control/big.json").c_str(), O_WRONLY | O_CREAT, 0600);
    REQUIRE(fd >= 0);
    REQUIRE(::ftruncate(fd, off_t{1} << 30) == 0);  // sparse: nothing of it is read
    ::close(fd);
  }
  CHECK_THAT(answer(dir, "link", 5, tick), Catch::Contains("a symbolic link, not a request: refused unread"));
  CHECK_THAT(answer(dir, "fifo", 5, tick), Catch::Contains("not a regular file: refused unread"));
  CHECK_THAT(answer(dir, "big", 5, tick), Catch::Contains("1073741824 bytes, more than 4096"));
  CHECK(std::filesystem::exists(elsewhere / "secret.json"));
  // 10,000 at once: all but 1,024 refused in one pass; the rest taken 64 a
  // poll. A status sent after them is still answered.
  for (int i = 0; i < 10000; ++i) std::ofstream(dir / fmt::format("control/q{:05d}.json", i)) << "{}";
  const auto t0 = std::chrono::steady_clock::now();
  const std::string refused = answer(dir, "q09999", 10, tick);
  CHECK_THAT(refused, Catch::Contains("too many pending requests (more than 1024)"));
  CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(5));
  CHECK_THAT(answer(dir, "q00000", 5, tick), Catch::Contains("\"status\": \"refused\""));
  send(dir, "a0", body(dir, "a0", "status"));  // sorts before the q's: taken first
  CHECK_THAT(answer(dir, "a0", 5, tick), Catch::Contains("\"status\": \"ok\""));
  rec.close();
  // close() answers what still waited, rather than leave ctl to time out.
  CHECK(answers(dir) >= 10000);
  CHECK_THAT(answer(dir, "q01023", 0), Catch::Contains("\"status\": \"refused\""));
  CHECK(std::filesystem::is_empty(dir / "control"));
}

TEST_CASE("a capture is refused once the disk budget stopped full capture; requests left at close() are answered",
          "[sdk][control]") {
  TempDir dir;
  Recorder rec{Options(dir.path).every(1).max_bytes(64 * 1024)};
  std::int64_t step = 0;
  const auto tick = [&] {
    rec.step(step);
    rec.capture("x", at::zeros({4096}));
    ++step;
  };
  for (int i = 0; i < 10; ++i) tick();
  rec.flush();
  send(dir, "c1", body(dir, "c1", "capture", ", \"steps\": 2"));
  CHECK_THAT(answer(dir, "c1", 5, tick),
             Catch::Contains("\"status\": \"refused\", \"step\": null, \"message\": \"full capture has stopped: the run "
                             "reached its disk budget"));
  send(dir, "c2", body(dir, "c2", "pause"));
  rec.close();
  CHECK_THAT(answer(dir, "c2", 0), Catch::Contains("the run was closed"));
}

TEST_CASE("a running capture window keeps its steps and include through an every, a pause or a refusal, and a second "
          "capture joins its include",
          "[sdk][control]") {
  // With a flight recorder, a window's steps are written through it; an
  // answer to anything but a capture once wiped the window (its steps went
  // back to the ring, its include was dropped).
  TempDir dir;
  Recorder rec{Options(dir.path).every(0).stats_every(1).flight_recorder(4)};
  std::int64_t step = 0;
  const auto tick = [&] {
    rec.step(step);
    rec.capture("fc1.x", at::full({4}, static_cast<double>(step)));
    rec.capture("fc2.x", at::full({4}, static_cast<double>(step)));
    rec.capture("fc3.x", at::full({4}, static_cast<double>(step)));
    ++step;
  };
  tick();
  send(dir, "c1", body(dir, "c1", "capture", ", \"steps\": 1000, \"include\": \"^fc1\""));
  std::string line = answer(dir, "c1", 5, tick);
  REQUIRE_THAT(line, Catch::Contains("\"status\": \"ok\""));
  const std::int64_t from = std::stoll(line.substr(line.find("\"step\": ") + 8));
  send(dir, "p1", body(dir, "p1", "pause"));
  REQUIRE_THAT(answer(dir, "p1", 5, tick), Catch::Contains("\"status\": \"ok\""));
  send(dir, "c2", body(dir, "c2", "capture", ", \"steps\": 2, \"include\": \"^fc2\""));
  line = answer(dir, "c2", 5, tick);
  CHECK_THAT(line, Catch::Contains("include (^fc1)|(^fc2)"));
  const std::int64_t last = step + 3;
  while (step <= last) tick();
  rec.close();
  // Every step of the window so far on disk (the pause did not stop it),
  // fc3 never.
  std::vector<std::string> names;
  std::vector<std::int64_t> fc1;
  for (const std::string& l : tt_test::read_lines(dir / "index.jsonl")) {
    const auto at = l.find("\"name\":\"");
    const std::string name = l.substr(at + 8, l.find('"', at + 8) - at - 8);
    CHECK(name != "fc3.x");
    if (name == "fc1.x") fc1.push_back(std::stoll(l.substr(l.find("\"step\":") + 7)));
  }
  std::sort(fc1.begin(), fc1.end());
  std::vector<std::int64_t> want;
  for (std::int64_t s = from; s <= last; ++s) want.push_back(s);
  CHECK(fc1 == want);
}
