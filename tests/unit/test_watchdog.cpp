// The stall watchdog (issue 60, DESIGN section 10): Options::stall_after.
// When no step() comes for that long, the writer thread writes a dumps.jsonl
// line with reason "stall", once per stall, naming the training threads that
// wait inside tensortap; it never applies after_dump. Times here are long
// against the writer's half-second wake, so a loaded machine does not make
// them flaky: each sleep is at least twice what it must outlast.
#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include <ATen/ATen.h>

#include <tensortap/tensortap.h>

#include "tests/support/helpers.h"

using tensortap::AfterDump;
using tensortap::Dump;
using tensortap::Options;
using tensortap::Recorder;
using tensortap::Trigger;
using tt_test::TempDir;

namespace {

void sleep_ms(int ms) { std::this_thread::sleep_for(std::chrono::milliseconds(ms)); }

// dumps.jsonl's lines with reason "stall".
std::vector<std::string> stall_lines(const TempDir& dir) {
  std::vector<std::string> out;
  if (!std::filesystem::exists(dir / "dumps.jsonl")) return out;
  for (const std::string& line : tt_test::read_lines(dir / "dumps.jsonl"))
    if (line.find("\"reason\": \"stall\"") != std::string::npos) out.push_back(line);
  return out;
}

}  // namespace

TEST_CASE("a stall: no step() for stall_after writes one stall line per stall, after the first step only",
          "[sdk][watchdog]") {
  TempDir dir;
  Recorder rec{Options(dir.path).stall_after(std::chrono::milliseconds(300))};
  sleep_ms(1000);  // before the first step: no stall
  CHECK(stall_lines(dir).empty());
  for (std::int64_t s = 0; s < 3; ++s) {
    rec.step(s);
    rec.capture("x", at::ones({4}));
  }
  sleep_ms(1500);  // a stall at step 2, said once however long it lasts
  auto lines = stall_lines(dir);
  REQUIRE(lines.size() == 1);
  CHECK_THAT(lines[0], Catch::StartsWith("{\"step\": 2, \"reason\": \"stall\", \"steps\": [], \"last_step\": 2, "
                                         "\"stalled_seconds\": "));
  CHECK_THAT(lines[0], Catch::EndsWith(", \"waiting\": []}"));
  // The next stall needs a new step.
  rec.step(3);
  sleep_ms(1500);
  lines = stall_lines(dir);
  REQUIRE(lines.size() == 2);
  CHECK_THAT(lines[1], Catch::Contains("\"last_step\": 3"));
  // Shown by dumps() from the next step on, as every dump; never acted on.
  rec.step(4);
  const std::vector<Dump> dumps = rec.dumps();
  REQUIRE(dumps.size() == 2);
  CHECK(dumps[0].trigger == "stall");
  CHECK(dumps[0].reason == "stall");
  CHECK(dumps[0].last_step == 2);
  CHECK(dumps[0].stalled_seconds >= 0.3);
  CHECK(dumps[0].steps.empty());
  CHECK(rec.counters().dumps == 2);
  rec.close();
  // After close() the watchdog is gone.
  sleep_ms(1000);
  CHECK(stall_lines(dir).size() == 2);
  const std::string run_json = tt_test::read_file(dir / "run.json");
  CHECK_THAT(run_json, Catch::Contains("\"stall_after_ms\": 300"));
  CHECK_THAT(run_json, Catch::Contains("\"reason\": \"stall\""));
}

TEST_CASE("a stall dumps the flight recorder's held steps and applies no after_dump: no Throw, no StopCapture",
          "[sdk][watchdog][flight]") {
  TempDir dir;
  Recorder rec{Options(dir.path)
                   .every(1)
                   .flight_recorder(2)
                   .after_dump(AfterDump::Throw)
                   .stall_after(std::chrono::milliseconds(300))};
  for (std::int64_t s = 0; s < 5; ++s) {
    rec.step(s);
    rec.capture("x", at::full({4}, static_cast<double>(s)));
  }
  rec.flush();
  sleep_ms(1500);
  const auto lines = stall_lines(dir);
  REQUIRE(lines.size() == 1);
  // The held steps (k = 2 before step 4, and step 4) are written.
  CHECK_THAT(lines[0], Catch::StartsWith("{\"step\": 4, \"reason\": \"stall\", \"steps\": [2,3,4], "));
  CHECK(tt_test::index_lines_with(dir.path, "\"name\":\"x\"").size() == 3);
  // Throw is not applied, and capture goes on into the flight recorder: a
  // NaN later dumps the steps before it that the stall did not write (5,
  // and 6 itself), and that dump throws.
  REQUIRE_NOTHROW(rec.step(5));
  rec.capture("x", at::full({4}, 5.0));
  rec.step(6);
  rec.capture("x", at::full({4}, std::nan("")));
  rec.flush();
  const std::string err = tt_test::error_of([&] { rec.step(7); });
  CHECK_THAT(err, Catch::Contains("the flight recorder dumped steps 5, 6"));
  rec.close();
}

TEST_CASE("a dump after the flight recorder stopped is still marked, with no steps (issue 60)",
          "[sdk][watchdog][flight]") {
  TempDir dir;
  Recorder rec{Options(dir.path)
                   .every(1)
                   .stats_every(1)
                   .flight_recorder(2)
                   .after_dump(AfterDump::StopCapture)
                   .dump_on(Trigger::non_finite())
                   .dump_on(Trigger::spike("loss", 5.0, 4))};
  for (std::int64_t s = 0; s < 12; ++s) {
    rec.step(s);
    rec.capture("x", at::full({4}, s == 3 ? std::nan("") : 1.0));
    rec.capture("loss", at::full({}, s == 9 ? 100.0 : 1.0));
    rec.flush();
  }
  rec.close();
  const auto dumps = rec.dumps();
  // The NaN at step 3 stopped the flight recorder; the spike at 9 is still said.
  REQUIRE(dumps.size() == 2);
  CHECK(dumps[0].reason == "nan");
  CHECK(dumps[0].steps == std::vector<std::int64_t>{1, 2, 3});
  CHECK(dumps[1].trigger == "spike");
  CHECK(dumps[1].step == 9);
  CHECK(dumps[1].steps.empty());
}

TEST_CASE("a stall names the training threads waiting inside tensortap: here in flush()", "[sdk][watchdog]") {
  TempDir dir;
  // A predicate that takes 2 s holds the writer thread in a batch, and so
  // the flush() that waits for it; the watchdog sees the stall when the
  // batch ends, before flush() returns.
  Recorder rec{Options(dir.path)
                   .stats_every(1)
                   .stall_after(std::chrono::milliseconds(1000))
                   .dump_on(Trigger::when([](const tensortap::TensorSummary&) {
                     std::this_thread::sleep_for(std::chrono::milliseconds(2500));
                     return false;
                   }))};
  rec.step(0);
  sleep_ms(700);  // the writer sees step 0
  rec.capture("x", at::ones({4}));
  rec.flush();
  const auto lines = stall_lines(dir);
  REQUIRE(lines.size() == 1);
  CHECK_THAT(lines[0], Catch::Matches(".*\"waiting\": \\[\"thread [0-9]+ in flush\\(\\) for [0-9.]+ s\"\\]\\}"));
  rec.close();
}

TEST_CASE("a stall_after below 0 is refused by name", "[sdk][watchdog]") {
  TempDir dir;
  CHECK_THAT(tt_test::error_of([&] { Recorder rec{Options(dir.path).stall_after(std::chrono::milliseconds(-1))}; }),
             Catch::Contains("Options::stall_after(-1 ms) must be 0 (off) or more"));
}
