// A disk budget (issue 59, DESIGN section 10): Options::max_bytes with
// Budget::StopCapture in every format, Budget::KeepLatest in Npy and Packed.
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <string>
#include <thread>

#include <catch2/catch.hpp>
#include <fmt/format.h>
#include <torch/torch.h>

#include <tensortap/tensortap.h>

#include "tests/support/helpers.h"
#include "writers/src/file.h"
#include "writers/src/run_dir.h"
#include "writers/src/run_records.h"

namespace fs = std::filesystem;
using tensortap::Options;
using tt_test::TempDir;

namespace {

// `du -sb`: the apparent sizes of everything under `path`, itself included.
std::uint64_t du_sb(const std::string& path) {
  std::uint64_t total = 0;
  struct stat st {};
  if (::lstat(path.c_str(), &st) == 0) total += static_cast<std::uint64_t>(st.st_size);
  for (const auto& e : fs::recursive_directory_iterator(path))
    if (::lstat(e.path().c_str(), &st) == 0) total += static_cast<std::uint64_t>(st.st_size);
  return total;
}

}  // namespace

TEST_CASE("a disk budget under StopCapture holds the run directory's size, in every format", "[sdk][budget]") {
  std::vector<tensortap::Format> formats{tensortap::Format::Npy, tensortap::Format::Packed};
#ifdef TENSORTAP_HAVE_HDF5
  formats.push_back(tensortap::Format::Hdf5);
#endif
  constexpr std::uint64_t kBudget = 2 << 20;
  constexpr std::int64_t kSteps = 80;  // 4 x 64 KiB a step: ten times the budget
  for (const tensortap::Format format : formats) {
    CAPTURE(static_cast<int>(format));
    TempDir dir;
    std::uint64_t largest_step = 0, worst = 0;
    tensortap::Counters c;
    const std::string err = tt_test::stderr_of(dir / "stderr", [&] {
      tensortap::Recorder rec{Options(dir / "run").format(format).stats_every(1).max_bytes(kBudget)};
      for (std::int64_t s = 0; s < kSteps; ++s) {
        rec.step(s);
        std::uint64_t step_bytes = 0;
        for (int k = 0; k < 4; ++k) {
          const torch::Tensor t = torch::full({16384}, static_cast<float>(s * 4 + k));
          rec.capture("t" + std::to_string(k), t);
          step_bytes += static_cast<std::uint64_t>(t.nbytes());
        }
        rec.capture("loss", torch::tensor(static_cast<float>(s)));
        rec.flush();
        largest_step = std::max(largest_step, step_bytes);
        worst = std::max(worst, du_sb(dir / "run"));  // measured at every step
      }
      rec.close();
      c = rec.counters();
    });
    // The target: within the budget, its reserve of 5%, and one step's records.
    CHECK(worst <= kBudget + kBudget / 20 + largest_step + 64 * 1024);
    CHECK(c.records > 0);
    CHECK(c.budget_refused > 0);
    CHECK(c.errors == 0);
    // Statistics went on past the budget: more rows than full records.
    CHECK(c.stats_rows > c.records);
    // Said once, naming the budget and the step.
    CHECK_THAT(err, Catch::Contains("reached its disk budget of 2097152 bytes (Options::max_bytes) at step"));
    CHECK(err.find("reached its disk budget") == err.rfind("reached its disk budget"));
    const std::string j = tt_test::read_file(dir / "run/run.json");
    CHECK_THAT(j, Catch::Contains("\"budget\": {\"max_bytes\": 2097152, \"policy\": \"stop_capture\", "
                                  "\"reached_at_step\": ") &&
                      Catch::Contains("\"given_up_below\": null}"));
    // What was written reads back whole: every indexed record.
    CHECK(tt_test::read_lines(dir / "run/index.jsonl").size() == static_cast<std::size_t>(c.records));
  }
}

TEST_CASE("Budget::KeepLatest with Format::Hdf5 is refused by name", "[sdk][budget]") {
  TempDir dir;
  CHECK_THAT(tt_test::error_of([&] {
               tensortap::Recorder r{Options(dir.path)
                                         .format(tensortap::Format::Hdf5)
                                         .max_bytes(1 << 20)
                                         .on_budget(tensortap::Budget::KeepLatest)};
             }),
             Catch::Contains("Options::on_budget(Budget::KeepLatest) with Format::Hdf5"));
}

namespace {

// Every index line of `run` (index.jsonl and its segments), and its marker.
std::vector<tensortap::detail::IndexRecord> index_of(const std::string& run) {
  const tensortap::detail::Dir d = tensortap::detail::Dir::open(run, false);
  return tensortap::detail::read_index(d, run);
}
std::int64_t marker_of(const std::string& run) {
  return tensortap::detail::given_up_below(tensortap::detail::Dir::open(run, false));
}

// The files of `run` under `sub` (npy/, packed/) whose name says step < `below`.
std::vector<std::string> files_of_steps_below(const std::string& run, std::int64_t below) {
  std::vector<std::string> out;
  for (const auto& e : fs::recursive_directory_iterator(fs::path(run) / "npy"))
    if (e.is_regular_file() && std::stoll(e.path().stem().string()) < below) out.push_back(e.path().string());
  return out;
}

constexpr int kNames = 4;

// A step of 4 x 64 KiB and a 0-d loss, every step flushed: `check(step)` after each.
template <typename F>
tensortap::Counters keep_latest_run(const Options& options, std::int64_t steps, F&& check) {
  tensortap::Recorder rec{options};
  for (std::int64_t s = 0; s < steps; ++s) {
    rec.step(s);
    for (int k = 0; k < kNames; ++k)
      rec.capture("t" + std::to_string(k), torch::full({16384}, static_cast<float>(s * kNames + k)));
    rec.capture("loss", torch::tensor(static_cast<float>(s)));
    rec.flush();
    check(s);
  }
  rec.close();
  return rec.counters();
}

// KeepLatest on `budget` in `format` at `run`: `steps` steps of `names`
// records of `floats` floats, never flushed; its stderr in `err`.
tensortap::Counters keep_latest_unflushed(const TempDir& dir, const std::string& run, tensortap::Format format,
                                          std::uint64_t budget, std::int64_t steps, int names, std::int64_t floats,
                                          std::string& err) {
  tensortap::Counters c;
  err = tt_test::stderr_of(dir / "stderr", [&] {
    tensortap::Recorder rec{Options(run).format(format).max_bytes(budget).on_budget(tensortap::Budget::KeepLatest)};
    for (std::int64_t s = 0; s < steps; ++s) {
      rec.step(s);
      for (int k = 0; k < names; ++k) rec.capture("t" + std::to_string(k), torch::full({floats}, 1.0f));
    }
    rec.close();
    c = rec.counters();
  });
  return c;
}

}  // namespace

TEST_CASE("KeepLatest keeps the newest whole steps within the budget, Npy and Packed", "[sdk][budget]") {
  constexpr std::uint64_t kBudget = 2 << 20;
  constexpr std::uint64_t kStep = kNames * 65536;
  constexpr std::int64_t kSteps = 80;  // ten times the budget
  for (const tensortap::Format format : {tensortap::Format::Npy, tensortap::Format::Packed}) {
    CAPTURE(static_cast<int>(format));
    TempDir dir;
    const std::string run = dir / "run";
    std::uint64_t worst = 0;
    tensortap::Counters c;
    const std::string err = tt_test::stderr_of(dir / "stderr", [&] {
      c = keep_latest_run(
          Options(run).format(format).stats_every(1).max_bytes(kBudget).on_budget(tensortap::Budget::KeepLatest),
          kSteps, [&](std::int64_t) { worst = std::max(worst, du_sb(run)); });  // measured at every step
    });
    // The target: the budget, its reserve of 5%, the largest step's records,
    // and Packed's one segment (max_bytes/8); 64 KiB for directories and headers.
    const std::uint64_t segment = format == tensortap::Format::Packed ? kBudget / 8 : 0;
    CHECK(worst <= kBudget + kBudget / 20 + kStep + segment + 64 * 1024);
    CHECK(c.errors == 0);
    // Every record found room: old steps made it.
    CHECK(c.budget_refused == 0);
    CHECK_THAT(err, Catch::Contains("the oldest steps are given up to make room (Budget::KeepLatest"));
    // run.json says what went, and the index's lines of those steps went
    // with their segments (index.jsonl, the first, among them).
    const std::int64_t k = marker_of(run);
    CHECK(k > 0);
    CHECK(k < kSteps - 3);
    const std::string j = tt_test::read_file(run + "/run.json");
    CHECK_THAT(j, Catch::Contains("\"policy\": \"keep_latest\"") &&
                      Catch::Contains(fmt::format("\"given_up_below\": {}}}", k)));
    CHECK_FALSE(fs::exists(run + "/index.jsonl"));
    // Nothing lost that the policy did not give up: every step from k on is
    // whole, each record's file there with its values.
    std::map<std::int64_t, int> per_step;
    for (const auto& r : index_of(run)) {
      if (r.step < k) continue;
      ++per_step[r.step];
      if (r.name != "t1") continue;
      const torch::Tensor t = r.offset ? tensortap::load_npy(run + "/" + r.file, *r.offset)
                                       : tensortap::load_npy(run + "/" + r.file);
      CHECK(t[0].item<float>() == static_cast<float>(r.step * kNames + 1));
    }
    CHECK(per_step.size() == static_cast<std::size_t>(kSteps - k));
    for (const auto& [step, n] : per_step) CHECK(n == kNames + 1);
    if (format == tensortap::Format::Npy) {
      CHECK(files_of_steps_below(run, k).empty());
    } else {
      for (const auto& e : fs::directory_iterator(run + "/packed")) CHECK(fs::file_size(e.path()) <= kBudget / 8);
    }
  }
}

TEST_CASE("KeepLatest writes no index line for a step given up before its lines were due", "[sdk][budget]") {
  // Index lines wait for their records to be durable: Packed makes them so
  // once a second, so a run shorter than that writes every line at close.
  // Lines of steps given up by then would stay in the index's last segment
  // past the budget (a CI run of the live reader check found 0.5 MiB of
  // them over a 1 MiB budget). Many small records, no flush: the lines are
  // a seventh of the bytes. (Npy's 32 folders, one a name, take 128 KiB.)
  constexpr std::uint64_t kBudget = 512 << 10;
  constexpr int kPerStep = 32;
  constexpr std::int64_t kSteps = 120;
  for (const tensortap::Format format : {tensortap::Format::Npy, tensortap::Format::Packed}) {
    CAPTURE(static_cast<int>(format));
    TempDir dir;
    const std::string run = dir / "run";
    std::string err;
    const tensortap::Counters c = keep_latest_unflushed(dir, run, format, kBudget, kSteps, kPerStep, 256, err);
    CAPTURE(err);
    CHECK(c.errors == 0);
    CHECK(c.budget_refused == 0);
    // Given up, they were written all the same.
    CHECK(c.records == kSteps * kPerStep);
    const std::uint64_t step_bytes = kPerStep * (1024 + 512);
    const std::uint64_t segment = format == tensortap::Format::Packed ? kBudget / 8 : 0;
    const std::uint64_t size = du_sb(run);
    CHECK(size <= kBudget + kBudget / 20 + step_bytes + segment + 64 * 1024);
    // The steps from the marker on, whole; below it, at most the lines of
    // the two segments (16 KiB each) that straddle the marker.
    const std::int64_t k = marker_of(run);
    CHECK(k > kSteps / 2);
    std::map<std::int64_t, int> per_step;
    std::size_t below = 0;
    const auto index = index_of(run);
    for (const auto& r : index) {
      if (r.step < k)
        ++below;
      else
        ++per_step[r.step];
    }
    CHECK(per_step.size() == static_cast<std::size_t>(kSteps - k));
    for (const auto& [step, n] : per_step) CHECK(n == kPerStep);
    std::uint64_t index_bytes = 0;
    for (const auto& e : fs::directory_iterator(run))
      if (e.path().extension() == ".jsonl" && e.path().stem().string().rfind("index", 0) == 0)
        index_bytes += fs::file_size(e.path());
    CHECK(below * index_bytes / index.size() <= 2 * 16384 + 1024);
  }
}

TEST_CASE("KeepLatest says so when a step does not fit whatever it gives up", "[sdk][budget]") {
  // Steps of 512 KiB on a budget of 256 KiB: each step's first records take
  // the room the steps before it give up, the rest are refused, and the run
  // says why, once. (So would a budget a model's .npy folders fill: 4 KiB a
  // name on most file systems, not on all, so this test does not use them.)
  for (const tensortap::Format format : {tensortap::Format::Npy, tensortap::Format::Packed}) {
    CAPTURE(static_cast<int>(format));
    TempDir dir;
    const std::string run = dir / "run";
    std::string err;
    const tensortap::Counters c = keep_latest_unflushed(dir, run, format, 256 << 10, 6, 8, 16384, err);
    CHECK(c.errors == 0);
    CHECK(c.budget_refused > 0);
    CHECK(c.records + c.budget_refused == 6 * 8);
    CHECK_THAT(err, Catch::Contains("does not fit its disk budget of 262144 bytes, and giving up every older step "
                                    "(dumped steps within their share stay) would not make room"));
    // Said once.
    CHECK(err.find("would not make room") == err.rfind("would not make room"));
    // The last step kept what fitted of it: its first records.
    const std::int64_t k = marker_of(run);
    CHECK(k == 5);
    std::set<std::string> last;
    for (const auto& r : index_of(run))
      if (r.step == 5) last.insert(r.name);
    CHECK(!last.empty());
    CHECK(last.count("t0") == 1);
    const std::uint64_t segment = format == tensortap::Format::Packed ? (256 << 10) / 8 : 0;
    CHECK(du_sb(run) <= (256 << 10) + (256 << 10) / 20 + segment + 64 * 1024);
  }
}

TEST_CASE("KeepLatest keeps dumped steps within their share", "[sdk][budget]") {
  constexpr std::uint64_t kBudget = 2 << 20;
  TempDir dir;
  const std::string run = dir / "run";
  std::vector<tensortap::Dump> dumps;
  tensortap::Counters c;
  std::int64_t first = 0;
  tt_test::stderr_of(dir / "stderr", [&] {
    // A flight recorder, whose steps a `tensortap ctl capture` window
    // stores (so that the budget fills), and two dumps in the window.
    tensortap::Recorder rec{Options(run)
                                .flight_recorder(2)
                                .after_dump(tensortap::AfterDump::Continue)
                                .max_bytes(kBudget)
                                .on_budget(tensortap::Budget::KeepLatest)};
    std::int64_t s = 0;
    rec.step(s);
    const std::string json = tt_test::read_file(run + "/run.json");
    const std::string id = json.substr(json.find("\"run_id\": \"") + 11, 32);
    const double now = std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
    {
      std::ofstream f(run + "/control/.c1.tmp");
      f << fmt::format(R"({{"id": "c1", "run": "{}", "command": "capture", "expires": {:.3f}, "steps": 100000}})",
                       id, now + 60);
    }
    REQUIRE(::rename((run + "/control/.c1.tmp").c_str(), (run + "/control/c1.json").c_str()) == 0);
    // In effect from the step after the writer thread took it (within a second).
    for (int i = 0; i < 100 && !fs::exists(run + "/control.jsonl"); ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
      rec.step(++s);
    }
    REQUIRE(fs::exists(run + "/control.jsonl"));
    first = ++s;
    for (; s < first + 120; ++s) {
      rec.step(s);
      for (int k = 0; k < kNames; ++k)
        rec.capture("t" + std::to_string(k), torch::full({16384}, static_cast<float>(s * kNames + k)));
      if (s == first + 7 || s == first + 15) rec.dump();
      rec.flush();
    }
    rec.close();
    dumps = rec.dumps();
    c = rec.counters();
  });
  REQUIRE(dumps.size() == 2);
  const std::int64_t k = marker_of(run);
  CAPTURE(c.records, c.budget_refused, first);
  REQUIRE(k > first + 16);
  std::set<std::int64_t> dumped;
  for (const auto& d : dumps) dumped.insert(d.steps.begin(), d.steps.end());
  CHECK(dumped.count(first + 7) == 1);
  CHECK(dumped.count(first + 15) == 1);
  // The dumped steps' records all there, below the marker; no other step below it.
  std::map<std::int64_t, int> below;
  for (const auto& r : index_of(run)) {
    if (r.step >= k) continue;
    const bool there = fs::exists(run + "/" + r.file);
    if (dumped.count(r.step) != 0) {
      CHECK(there);
      ++below[r.step];
    } else {
      CHECK_FALSE(there);
    }
  }
  for (std::int64_t d : dumped) CHECK(below[d] == kNames);
  CHECK(c.errors == 0);
  CHECK(c.budget_refused == 0);
}

namespace {

// A Linear(64, 64)'s parameters, 40 steps flushed, into 256 KiB under
// KeepLatest at `run`: most steps given up. Returns the module.
torch::nn::Linear params_into_small_budget(const TempDir& dir, const std::string& run) {
  torch::nn::Linear lin(64, 64);
  tt_test::stderr_of(dir / "stderr", [&] {
    auto rec = tensortap::watch(*lin, Options(run)
                                          .kinds({tensortap::Kind::Param})
                                          .max_bytes(256 << 10)
                                          .on_budget(tensortap::Budget::KeepLatest));
    for (std::int64_t s = 0; s < 40; ++s) {
      rec->step(s);
      rec->flush();
    }
    rec->close();
  });
  return lin;
}

}  // namespace

TEST_CASE("load_params of a step KeepLatest gave up says so", "[sdk][budget]") {
  TempDir dir;
  const std::string run = dir / "run";
  torch::nn::Linear lin = params_into_small_budget(dir, run);
  const std::int64_t k = marker_of(run);
  REQUIRE(k > 0);
  CHECK_THAT(tt_test::error_of([&] { tensortap::load_params(*lin, run, 0); }),
             Catch::Contains("gave up step 0 to its disk budget") &&
                 Catch::Contains(fmt::format("\"given_up_below\" is {}", k)));
  tensortap::load_params(*lin, run, 39);  // a step kept loads
}

TEST_CASE("KeepLatest killed at any moment leaves every record it still shows on disk", "[sdk][budget][slow]") {
  // SIGKILL between run.json's marker and the deletions, or amid them: the
  // lines of steps at or above the marker always have their files.
  int given_up = 0;
  for (const int delay_ms : {300, 500, 700, 900}) {
    CAPTURE(delay_ms);
    TempDir dir;
    const std::string run = dir / "run";
    const pid_t pid = ::fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
      ::freopen("/dev/null", "w", stderr);
      tensortap::Recorder rec{Options(run).max_bytes(512 << 10).on_budget(tensortap::Budget::KeepLatest)};
      for (std::int64_t s = 0;; ++s) {
        rec.step(s);
        for (int k = 0; k < kNames; ++k) rec.capture("t" + std::to_string(k), torch::full({4096}, 1.0f));
        if (s % 4 == 0) rec.flush();
      }
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(delay_ms));
    ::kill(pid, SIGKILL);
    int status = 0;
    ::waitpid(pid, &status, 0);
    if (!fs::exists(run + "/run.json")) continue;
    const std::int64_t k = marker_of(run);
    given_up += k > 0 ? 1 : 0;
    // (It may show none: killed before the first line, or after a give-up
    // and before the lines of the steps that made it.)
    for (const auto& r : index_of(run))
      if (r.step >= k) CHECK(fs::exists(run + "/" + r.file));
  }
  // 8 steps fill the budget: the later kills came after steps were given up.
  CHECK(given_up > 0);
}

TEST_CASE("no budget: max_bytes 0 changes nothing, and run.json has no budget", "[sdk][budget]") {
  TempDir dir;
  tensortap::Recorder rec{Options(dir.path)};
  rec.step(0);
  rec.capture("x", torch::ones({4}));
  rec.close();
  CHECK(rec.counters().budget_refused == 0);
  CHECK(tt_test::read_file(dir / "run.json").find("\"budget\"") == std::string::npos);
}

TEST_CASE("the index's segment names: index.<n>.jsonl and their ballasts, nothing like them", "[sdk][budget]") {
  // The samples of tests/python/test_file_names.py (the reader's rule).
  using tensortap::detail::is_index_segment_name;
  for (const char* name : {"index.1.jsonl", "index.2.jsonl", "index.10.jsonl", "index.999999999.jsonl",
                           ".index.1.jsonl.room", ".index.10.jsonl.room", ".index.999999999.jsonl.room"})
    CHECK(is_index_segment_name(name));
  for (const char* name :
       {"index.0.jsonl", "index.01.jsonl", "index.00.jsonl", "index.-1.jsonl", "index.+1.jsonl",
        "index.1000000000.jsonl", "index..jsonl", "index.x.jsonl", "index.1x.jsonl", "index. 1.jsonl",
        "index.1.jsonl.tmp", "index.1.json", "xindex.1.jsonl", "index.1.jsonlx", "index.\u0661.jsonl",
        ".index.0.jsonl.room", ".index.01.jsonl.room", "index.1.jsonl.room", ".index.1.jsonl",
        ".index.1.jsonl.room.tmp", "..index.1.jsonl.room", ".index.jsonl.room.room", "index.jsonl"})
    CHECK_FALSE(is_index_segment_name(name));
  CHECK(tensortap::detail::index_segment_name(0) == "index.jsonl");
  CHECK(tensortap::detail::index_segment_name(12) == "index.12.jsonl");
}

TEST_CASE("KeepLatest with steps near a packed segment's size keeps finding room", "[sdk][budget]") {
  // Steps of a few records near a segment's size (max_bytes/8), several
  // budgets: giving up old segments always finds room, nothing is refused.
  // (A segment rolled after its step was given up is left below the marker;
  // the plans count it and delete it without a new marker. These sizes did
  // not reach that case with the plans of before: a review found it.)
  for (const std::uint64_t budget : {std::uint64_t{512} << 10, std::uint64_t{1} << 20}) {
    for (const std::int64_t floats : {10240, 16384}) {
      CAPTURE(budget, floats);
      TempDir dir;
      const std::string run = dir / "run";
      tensortap::Counters c;
      tt_test::stderr_of(dir / "stderr", [&] {
        tensortap::Recorder rec{Options(run)
                                    .format(tensortap::Format::Packed)
                                    .max_bytes(budget)
                                    .on_budget(tensortap::Budget::KeepLatest)};
        for (std::int64_t s = 0; s < 60; ++s) {
          rec.step(s);
          for (int k = 0; k < 3; ++k) rec.capture("t" + std::to_string(k), torch::full({floats}, 1.0f));
          rec.flush();
        }
        rec.close();
        c = rec.counters();
      });
      CHECK(c.budget_refused == 0);
      CHECK(marker_of(run) > 0);
    }
  }
}

TEST_CASE("planted index segments: refused at open, and read back never through a link or a FIFO", "[sdk][budget]") {
  TempDir dir;
  const std::string run = dir / "run";
  // A segment's name in a directory that holds no run is in the way (overwrite would remove it).
  fs::create_directories(run);
  { std::ofstream(run + "/index.4.jsonl") << "{}\n"; }
  CHECK_THAT(tt_test::error_of([&] {
               tensortap::Recorder r{Options(run).max_bytes(1 << 20).on_budget(tensortap::Budget::KeepLatest)};
             }),
             Catch::Contains("index.4.jsonl") && Catch::Contains("is in the way"));
  fs::remove(run + "/index.4.jsonl");
  torch::nn::Linear lin = params_into_small_budget(dir, run);
  // After the run: a segment planted past the last, as a link out of the
  // run, then as a FIFO: a clear error naming it, no hang.
  { std::ofstream(dir / "outside.jsonl") << "{}\n"; }
  fs::create_symlink(dir / "outside.jsonl", run + "/index.999.jsonl");
  CHECK_THAT(tt_test::error_of([&] { tensortap::load_params(*lin, run, 39); }),
             Catch::Contains("index.999.jsonl") && Catch::Contains("symbolic link"));
  fs::remove(run + "/index.999.jsonl");
  REQUIRE(::mkfifo((run + "/index.999.jsonl").c_str(), 0600) == 0);
  CHECK_THAT(tt_test::error_of([&] { tensortap::load_params(*lin, run, 39); }),
             Catch::Contains("index.999.jsonl") && Catch::Contains("not a regular file"));
  fs::remove(run + "/index.999.jsonl");
  tensortap::load_params(*lin, run, 39);
}

TEST_CASE("a segment name planted mid-run stops the index rolling, and nothing else", "[sdk][budget]") {
  // The next segment's name taken while the job runs (an empty file): the
  // index cannot roll, so its segment takes every line from then on, in one
  // write a sync (not a try a line); no record is lost or refused, no error.
  TempDir dir;
  const std::string run = dir / "run";
  tensortap::Counters c;
  tt_test::stderr_of(dir / "stderr", [&] {
    tensortap::Recorder rec{Options(run).max_bytes(1 << 20).on_budget(tensortap::Budget::KeepLatest)};
    for (std::int64_t s = 0; s < 60; ++s) {
      if (s == 2) std::ofstream(run + "/index.1.jsonl").flush();
      rec.step(s);
      for (int k = 0; k < 16; ++k) rec.capture("t" + std::to_string(k), torch::full({4096}, static_cast<float>(s)));
      if (s % 3 == 0) rec.flush();
    }
    rec.close();
    c = rec.counters();
  });
  CHECK(c.errors == 0);
  CHECK(c.budget_refused == 0);
  CHECK(c.records == 60 * 16);
  const std::int64_t k = marker_of(run);
  CHECK(k > 10);
  std::map<std::int64_t, int> per_step;
  for (const auto& r : index_of(run))
    if (r.step >= k) ++per_step[r.step];
  CHECK(per_step.size() == static_cast<std::size_t>(60 - k));
  for (const auto& [step, n] : per_step) CHECK(n == 16);
  CHECK(fs::file_size(run + "/index.1.jsonl") == 0);
  CHECK(fs::exists(run + "/index.jsonl"));
}
