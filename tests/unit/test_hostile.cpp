// Regression tests for an adversarial review: each case broke tensortap
// before its fix (a hang, a heap overflow, writes outside the run directory,
// lost or mixed data). tests/README.md lists them with what they do now.
#include <dirent.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <future>
#include <limits>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>
#include <torch/torch.h>

#include <tensortap/tensortap.h>

#include "tests/support/helpers.h"
#include "tests/support/net.h"
#include "writers/src/file.h"
#include "writers/src/lines_file.h"

using tensortap::Format;
using tensortap::Options;
using tensortap::Overflow;
using tensortap::Recorder;
using tt_test::TempDir;
namespace fs = std::filesystem;

namespace {

using tt_test::error_of;

// Runs `f` on its own thread; a run that does not end within `seconds` is a
// hang: the test fails and the process ends (the stuck threads cannot be
// joined).
void must_end(const std::function<void()>& f, int seconds, const std::string& what) {
  auto done = std::async(std::launch::async, f);
  if (done.wait_for(std::chrono::seconds(seconds)) != std::future_status::ready) {
    FAIL_CHECK(what << " did not end within " << seconds << " s: a hang");
    std::_Exit(1);
  }
  done.get();
}

std::size_t open_descriptors() {
  std::size_t n = 0;
  for (const auto& e : fs::directory_iterator("/proc/self/fd")) {
    (void)e;
    ++n;
  }
  return n;
}

std::size_t index_size(const std::string& run) { return tt_test::read_lines(run + "/index.jsonl").size(); }

struct Cwd {
  std::string saved = fs::current_path().string();
  ~Cwd() { fs::current_path(saved); }
};

using tt_test::Net;

}  // namespace

// [slow]: 20 recorders with 256 MiB of staging each, which the writer
// populates at start (10-20 s); CI runs it, the fast loop leaves it out.
TEST_CASE("close() never hangs while another thread is inside capture()", "[sdk][hostile][slow]") {
  std::mt19937 rng(7);
  for (const std::int64_t elements : {std::int64_t{16} << 10, std::int64_t{2} << 20}) {  // 64 KiB, 8 MiB
    for (int trial = 0; trial < 10; ++trial) {
      INFO("tensors of " << elements * 4 << " bytes, trial " << trial);
      TempDir dir;
      auto rec = std::make_shared<Recorder>(Options(dir.path).buffer_bytes(std::size_t{256} << 20));
      rec->step(0);
      std::atomic<bool> stop{false};
      const auto t = torch::ones({elements});
      std::thread capturer([&] {
        try {
          while (!stop.load()) rec->capture("x", t);
        } catch (const tensortap::Error&) {
          // capture() after close() says so: the run is over.
        }
      });
      const int wait_ms = static_cast<int>(rng() % 31);
      must_end(
          [&] {
            std::this_thread::sleep_for(std::chrono::milliseconds(wait_ms));
            rec->close();
            stop = true;
            capturer.join();
          },
          60, "close()");
      // Everything committed before or during close is written and indexed.
      const auto s = rec->counters();
      REQUIRE(s.errors == 0);
      REQUIRE(s.records == s.captured);
      REQUIRE(static_cast<std::int64_t>(index_size(dir.path)) == s.records);
    }
  }
}

TEST_CASE("size options are bounded, with the value and the limit in the error", "[sdk][hostile]") {
  TempDir dir;
  const auto max = std::numeric_limits<std::size_t>::max();
  REQUIRE_THAT(error_of([&] { Recorder r{Options(dir.path).buffer_bytes(max)}; }),
               Catch::Contains("buffer_bytes(18446744073709551615)") && Catch::Contains("1099511627776"));
  REQUIRE_THAT(error_of([&] { Recorder r{Options(dir.path).flight_recorder_bytes(max)}; }),
               Catch::Contains("flight_recorder_bytes") && Catch::Contains("281474976710656"));
  REQUIRE_THAT(error_of([&] { Recorder r{Options(dir.path).hdf5(tensortap::Hdf5Options().chunk_bytes(max))}; }),
               Catch::Contains("chunk_bytes") && Catch::Contains("1073741824"));
  REQUIRE_THAT(error_of([&] { Recorder r{Options(dir.path).steps({3, -1})}; }), Catch::Contains("-1"));
  // Nothing was created by the refused ones.
  REQUIRE_FALSE(fs::exists(dir / "run.json"));
}

TEST_CASE("a tensor with more dimensions than the format stores is refused at capture()", "[sdk][hostile]") {
  TempDir dir;
  Recorder rec{Options(dir.path)};
  rec.step(0);
  REQUIRE_THAT(error_of([&] { rec.capture("deep", torch::ones(std::vector<std::int64_t>(33, 1))); }),
               Catch::Contains("'deep'") && Catch::Contains("32 dimensions"));
  rec.capture("ok", torch::ones(std::vector<std::int64_t>(32, 1)));
  rec.close();
  REQUIRE(rec.counters().records == 1);
#ifdef TENSORTAP_HAVE_HDF5
  TempDir h5;
  Recorder hrec{Options(h5.path).format(Format::Hdf5)};
  hrec.step(0);
  REQUIRE_THAT(error_of([&] { hrec.capture("deep", torch::ones(std::vector<std::int64_t>(32, 1))); }),
               Catch::Contains("'deep'") && Catch::Contains("31 dimensions"));
  hrec.capture("ok", torch::ones(std::vector<std::int64_t>(31, 1)));
  hrec.close();
  REQUIRE(hrec.counters().records == 1);
  REQUIRE(hrec.counters().errors == 0);
#endif
}

TEST_CASE("index lines stay whole when an append fails part way", "[writers][hostile]") {
  TempDir dir;
  const auto d = tensortap::detail::Dir::open(dir.path, false);
  tensortap::detail::LinesFile lines(d, "index.jsonl");
  lines.append("{\"a\":1}\n{\"b\":2}\n");
  // A file size limit just above what is there makes the next large append
  // short, then fail.
  tt_test::FileSizeLimit limit(64);
  std::string err;
  try {
    lines.append(std::string(200, 'x') + "\n");
  } catch (const tensortap::Error& e) {
    err = e.what();
  }
  limit.lift();
  REQUIRE_THAT(err, Catch::Contains("index.jsonl"));
  REQUIRE(tt_test::read_file(dir / "index.jsonl") == "{\"a\":1}\n{\"b\":2}\n");
  lines.append("{\"c\":3}\n");
  REQUIRE(tt_test::read_lines(dir / "index.jsonl") == std::vector<std::string>{"{\"a\":1}", "{\"b\":2}", "{\"c\":3}"});
}

TEST_CASE("two writers cannot share a run directory", "[sdk][hostile]") {
  TempDir dir;
  {
    Recorder first{Options(dir.path)};
    REQUIRE_THAT(error_of([&] { Recorder second{Options(dir.path).overwrite(true)}; }),
                 Catch::Contains(dir.path) && Catch::Contains("in use by another recorder"));
    first.step(0);
    first.capture("x", torch::ones({2}));
  }
  // Once the first has closed, overwrite replaces its run.
  Recorder third{Options(dir.path).overwrite(true)};
  third.close();
  // Started together, exactly one of two wins, every time.
  for (int trial = 0; trial < 50; ++trial) {
    TempDir race;
    std::atomic<int> won{0}, lost{0};
    std::vector<std::thread> threads;
    for (int t = 0; t < 2; ++t)
      threads.emplace_back([&] {
        try {
          Recorder r{Options(race.path)};
          ++won;
          std::this_thread::sleep_for(std::chrono::milliseconds(5));
        } catch (const tensortap::Error&) {
          ++lost;
        }
      });
    for (auto& t : threads) t.join();
    REQUIRE(won == 1);
    REQUIRE(lost == 1);
  }
}

TEST_CASE("overwrite removes every file tensortap writes, and only those", "[sdk][hostile]") {
  TempDir dir;
  {
    Recorder old{Options(dir.path).stats_every(1).flight_recorder(2)};
    old.step(0);
    old.capture("a", torch::ones({2}));
    old.dump();
  }
  REQUIRE(fs::exists(dir / "stats.npy"));
  REQUIRE(fs::exists(dir / "dumps.jsonl"));
  std::ofstream(dir / "notes.txt") << "mine";
  {
    Recorder fresh{Options(dir.path).overwrite(true)};
    fresh.step(0);
    fresh.capture("b", torch::ones({2}));
  }
  REQUIRE_FALSE(fs::exists(dir / "stats.npy"));
  REQUIRE_FALSE(fs::exists(dir / "stats_series.jsonl"));
  REQUIRE_FALSE(fs::exists(dir / "dumps.jsonl"));
  REQUIRE_FALSE(fs::exists(dir / "npy/tensor/a"));
  REQUIRE(tt_test::read_file(dir / "notes.txt") == "mine");
  // Without overwrite, a file of tensortap's name in a directory with no run is refused.
  TempDir stray;
  std::ofstream(stray / "stats.npy") << "not ours";
  REQUIRE_THAT(error_of([&] { Recorder r{Options(stray.path)}; }),
               Catch::Contains("stats.npy") && Catch::Contains("in the way"));
  REQUIRE(tt_test::read_file(stray / "stats.npy") == "not ours");
}

TEST_CASE("a closed recorder holds no file descriptor while the model lives on", "[sdk][hostile]") {
  Net net;
  const std::size_t before = open_descriptors();
  std::vector<std::shared_ptr<Recorder>> kept;
  std::vector<std::unique_ptr<TempDir>> dirs;
  for (int i = 0; i < 100; ++i) {
    dirs.push_back(std::make_unique<TempDir>());
    Options o(dirs.back()->path);
    o.stats_every(1);
#ifdef TENSORTAP_HAVE_HDF5
    if (i % 2 == 1) o.format(Format::Hdf5);
#endif
    auto rec = tensortap::watch(*net, o);
    rec->step(0);
    (net->forward(torch::randn({2, 3})) * 2).sum().backward();
    rec->close();
    kept.push_back(rec);
  }
  REQUIRE(open_descriptors() == before);
}

TEST_CASE("a relative run directory stays where it was when the process changes directory", "[sdk][hostile]") {
  TempDir a, b;
  Cwd restore;
  fs::current_path(a.path);
  Recorder rec{Options("run_rel")};
  fs::current_path(b.path);
  rec.step(0);
  rec.capture("x", torch::ones({2}));
  rec.close();
  REQUIRE(tt_test::read_file(a / "run_rel/run.json").find("\"closed\": true") != std::string::npos);
  REQUIRE(fs::exists(a / "run_rel/npy/tensor/x/00000000.npy"));
  REQUIRE(index_size(a / "run_rel") == 1);
  REQUIRE(fs::is_empty(b.path));
}

TEST_CASE("links planted in a run directory are never followed", "[sdk][hostile]") {
  TempDir outside;
  std::ofstream(outside / "sentinel") << "keep";
  fs::create_directories(outside / "dir");
  const std::vector<std::string> planted = {"npy", "stats.npy", "stats_series.jsonl", "dumps.jsonl"
#ifdef TENSORTAP_HAVE_HDF5
                                            ,
                                            "tensors.h5", ".tensors.h5.journal"
#endif
  };
  for (const auto& name : planted) {
    INFO("a link at " << name);
    TempDir run;
    fs::create_symlink(name == "npy" ? outside / "dir" : outside / "sentinel", run / name);
    Options o(run.path);
    o.stats_every(1);
    if (name.find("tensors.h5") != std::string::npos) o.format(Format::Hdf5);
    REQUIRE_THAT(error_of([&] { Recorder r{o}; }), Catch::Contains(name) && Catch::Contains("in the way"));
    // With overwrite the link itself goes, never what it points to.
    {
      Recorder r{o.overwrite(true)};
      r.step(0);
      r.capture("x", torch::ones({2}));
    }
    REQUIRE_FALSE(fs::is_symlink(run / name));
    REQUIRE(tt_test::read_file(outside / "sentinel") == "keep");
    REQUIRE(fs::is_empty(outside / "dir"));
  }
  // A link at the temporary run.json is written through is replaced, not followed.
  TempDir run;
  fs::create_symlink(outside / "sentinel", run / ".run.json.tmp");
  { Recorder r{Options(run.path)}; }
  REQUIRE(tt_test::read_file(outside / "sentinel") == "keep");
  REQUIRE(tt_test::read_file(run / "run.json").find("\"closed\": true") != std::string::npos);
  // A name's directory turned into a link during the run: that record fails,
  // nothing lands outside.
  TempDir live;
  Recorder rec{Options(live.path)};
  rec.step(0);
  rec.capture("y", torch::ones({2}));
  rec.flush();
  fs::create_symlink(outside / "dir", live / "npy/tensor/x");
  rec.step(1);
  rec.capture("x", torch::ones({2}));
  REQUIRE_THAT(error_of([&] { rec.flush(); }), Catch::Contains("symbolic link"));
  REQUIRE(fs::is_empty(outside / "dir"));
  REQUIRE(rec.counters().errors == 1);
  REQUIRE_THAT(error_of([&] { rec.close(); }), Catch::Contains("symbolic link"));
#ifdef TENSORTAP_HAVE_HDF5
  // The HDF5 writer's rollback journal, planted as a link during the run
  // before a new name comes: replaced, not followed, and gone once the new
  // name's datasets exist.
  TempDir h5;
  Recorder h{Options(h5.path).format(Format::Hdf5)};
  h.step(0);
  h.capture("a", torch::ones({2}));
  h.flush();
  fs::create_symlink(outside / "sentinel", h5 / ".tensors.h5.journal");
  h.step(1);
  h.capture("b", torch::ones({2}));
  h.flush();
  REQUIRE_FALSE(fs::exists(fs::symlink_status(h5 / ".tensors.h5.journal")));
  h.close();
  REQUIRE(tt_test::read_file(outside / "sentinel") == "keep");
  REQUIRE(h.counters().errors == 0);
  REQUIRE(index_size(h5.path) == 2);
#endif
  // save_npy()'s temporary is never followed either.
  TempDir user;
  fs::create_symlink(outside / "sentinel", user / ".w.npy.tmp");
  tensortap::save_npy(user / "w.npy", torch::ones({3}));
  REQUIRE(tt_test::read_file(outside / "sentinel") == "keep");
  REQUIRE(torch::equal(tensortap::load_npy(user / "w.npy"), torch::ones({3})));
}

TEST_CASE("names that are not UTF-8 stay distinct from real characters", "[sdk][hostile]") {
  TempDir dir;
  Recorder rec{Options(dir.path)};
  rec.step(0);
  rec.capture("\xC3", torch::zeros({1}));
  rec.capture("\xC3\x83", torch::ones({1}));  // "Ã"
  rec.close();
  REQUIRE(tt_test::index_lines_with(dir.path, "\"name\":\"\\udcc3\"").size() == 1);
  REQUIRE(tt_test::index_lines_with(dir.path, "\"name\":\"\xC3\x83\"").size() == 1);
  REQUIRE(rec.counters().records == 2);
}

TEST_CASE("stress: captures, steps, flushes and a close at a random moment always end, and add up",
          "[sdk][hostile][slow]") {
  const std::vector<std::string> names = {"a", "b", "c", "a/b", "long"};
  int runs = 0;
  for (const Format format : {Format::Npy, Format::Packed,
#ifdef TENSORTAP_HAVE_HDF5
                              Format::Hdf5
#endif
       }) {
    for (const Overflow overflow : {Overflow::Block, Overflow::DropNewest}) {
      for (unsigned seed = 0; seed < 30; ++seed) {
        INFO("format " << static_cast<int>(format) << " overflow " << static_cast<int>(overflow) << " seed " << seed);
        TempDir dir;
        auto rec = std::make_shared<Recorder>(
            Options(dir.path).format(format).overflow(overflow).buffer_bytes(64 << 10).stats_every(3));
        rec->step(0);
        std::atomic<bool> stop{false};
        std::atomic<std::int64_t> next_step{1};
        std::vector<std::thread> threads;
        for (int t = 0; t < 3; ++t)
          threads.emplace_back([&, t] {
            std::mt19937 rng(seed * 31 + static_cast<unsigned>(t));
            while (!stop) {
              const auto n = static_cast<std::int64_t>(1 + rng() % (64 << 10));  // 4 B to 256 KiB
              try {
                rec->capture(names[rng() % names.size()], torch::full({n}, static_cast<float>(t)));
              } catch (const tensortap::Error&) {
                // After close(): the run is over, as the message says.
              }
            }
          });
        threads.emplace_back([&] {
          while (!stop) {
            try {
              rec->step(next_step++);
            } catch (const tensortap::Error&) {
            }
            std::this_thread::sleep_for(std::chrono::microseconds(200));
          }
        });
        threads.emplace_back([&] {
          while (!stop) {
            try {
              rec->flush();
            } catch (const tensortap::Error&) {
            }
          }
        });
        std::mt19937 rng(seed);
        const int wait_ms = static_cast<int>(rng() % 50);
        must_end(
            [&] {
              std::this_thread::sleep_for(std::chrono::milliseconds(wait_ms));
              // A close() that throws fails the test, after the threads end:
              // not an abort that hides which run it was.
              std::exception_ptr closing;
              try {
                rec->close();
              } catch (...) {
                closing = std::current_exception();
              }
              stop = true;
              for (auto& t : threads) t.join();
              if (closing) std::rethrow_exception(closing);
            },
            120, "a stressed run");
        const auto s = rec->counters();
        REQUIRE(s.errors == 0);
        REQUIRE(s.records == s.captured);  // captured = written + errors; dropped apart
        if (overflow == Overflow::Block) REQUIRE(s.dropped == 0);
        REQUIRE(static_cast<std::int64_t>(index_size(dir.path)) == s.records);
        if (format == Format::Npy)
          for (const auto& line : tt_test::read_lines(dir / "index.jsonl")) {
            const auto at = line.find("\"file\":\"") + 8;
            REQUIRE(fs::exists(dir / line.substr(at, line.find('"', at) - at)));
          }
        ++runs;
      }
    }
  }
  REQUIRE(runs >= 120);
}

TEST_CASE("in a fork() child the recorder is inert: calls return, nothing is written, the destructor returns",
          "[sdk][hostile][fork]") {
  TempDir dir;
  const std::string run = dir / "run";
  Net model;
  auto rec = tensortap::watch(*model, Options(run).stats_every(1));
  rec->step(0);
  const torch::Tensor x = torch::randn({4, 3}), small = torch::ones({64});
  // Another thread keeps the pipeline busy while the process forks, so a
  // child inherits whatever locks the capturing and writer threads held.
  std::atomic<bool> stop{false};
  std::thread busy([&] {
    while (!stop.load()) {
      rec->capture("busy", small);
      std::this_thread::sleep_for(std::chrono::microseconds(300));
    }
  });
  int hung = 0, failed = 0;
  for (int trial = 0; trial < 16; ++trial) {
    const pid_t pid = fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
      alarm(20);  // a hang ends the child with SIGALRM
      int rc = 0;
      try {
        rec->step(1);
        rec->capture("child", small);
        model->forward(x).sum().backward();
        rec->flush();
        rec->close();
        if (rec->counters().records != 0) rc = 3;  // a child sees no counts of the parent's
        rec.reset();
        model = Net(nullptr);  // the hooks' hold on the recorder goes too
      } catch (...) {
        rc = 2;
      }
      _exit(rc);
    }
    int status = 0;
    REQUIRE(waitpid(pid, &status, 0) == pid);
    if (WIFSIGNALED(status))
      ++hung;
    else if (WEXITSTATUS(status) != 0)
      ++failed;
  }
  stop = true;
  busy.join();
  CHECK(hung == 0);
  CHECK(failed == 0);
  // The parent's run: still open, nothing of the children's in it.
  CHECK_THAT(tt_test::read_file(run + "/run.json"), Catch::Contains("\"closed\": false"));
  rec->close();
  const auto lines = tt_test::read_lines(run + "/index.jsonl");
  CHECK(lines.size() == static_cast<std::size_t>(rec->counters().records));
  for (const auto& l : lines) {
    CHECK_THAT(l, !Catch::Contains("\"child\""));
    CHECK_THAT(l, Catch::Contains("\"step\":0"));
  }
  CHECK_THAT(tt_test::read_file(run + "/run.json"), Catch::Contains("\"closed\": true"));
}

TEST_CASE("a recorder made in a fork() child works there", "[sdk][hostile][fork]") {
  TempDir dir;
  Recorder parent{Options(dir / "parent")};
  parent.step(0);
  const pid_t pid = fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    alarm(20);
    int rc = 0;
    try {
      Recorder child{Options(dir / "child")};
      child.step(0);
      child.capture("x", torch::ones({3}));
      child.close();
      rc = child.counters().records == 1 ? 0 : 3;
    } catch (...) {
      rc = 2;
    }
    _exit(rc);
  }
  int status = 0;
  REQUIRE(waitpid(pid, &status, 0) == pid);
  REQUIRE(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 0);
  CHECK(tt_test::read_lines(dir / "child/index.jsonl").size() == 1);
  parent.close();
}

TEST_CASE("a fork() child does not keep the parent's run directory locked (round 4)", "[sdk][hostile][fork]") {
  // The flock belongs to the open file description the child shares: after
  // the parent's close(), a new recorder there was refused ("in use by
  // another recorder") while any forked worker lived, the child's own too.
  TempDir dir;
  const std::string run = dir / "run";
  auto parent = std::make_unique<Recorder>(Options(run));
  parent->step(0);
  parent->capture("x", torch::ones({3}));
  int go[2];
  REQUIRE(pipe(go) == 0);
  const pid_t pid = fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    alarm(20);
    char c = 0;
    int rc = read(go[0], &c, 1) == 1 ? 0 : 4;  // the parent has closed
    try {
      Recorder child{Options(run).overwrite(true)};
      child.close();
    } catch (...) {
      rc = 2;
    }
    _exit(rc);
  }
  parent->close();
  // The child lives on, holding its copy of everything the parent had open.
  CHECK_NOTHROW(Recorder(Options(run).overwrite(true)).close());
  REQUIRE(write(go[1], "x", 1) == 1);
  int status = 0;
  REQUIRE(waitpid(pid, &status, 0) == pid);
  REQUIRE(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 0);
  close(go[0]);
  close(go[1]);
}

TEST_CASE("a run directory is unlocked at close even while another descriptor shares its lock (round 4)",
          "[sdk][hostile][fork]") {
  // The fork() case above, without its race: a child that has not run yet
  // still shares the lock's open file description, and closing the
  // parent's descriptor alone left the directory locked until the child's
  // atfork handler ran (the case failed now and then in the suite). Here a
  // dup() of the lock's descriptor stands for that child's copy.
  TempDir dir;
  const std::string run = dir / "run";
  auto first = std::make_unique<Recorder>(Options(run));
  int copy = -1;
  for (const auto& entry : fs::directory_iterator("/proc/self/fd")) {
    std::error_code ec;
    const fs::path target = fs::read_symlink(entry.path(), ec);
    if (!ec && target.filename() == ".tensortap.lock") copy = ::dup(std::stoi(entry.path().filename().string()));
  }
  REQUIRE(copy >= 0);
  first->close();
  CHECK_NOTHROW(Recorder(Options(run).overwrite(true)).close());
  ::close(copy);
}

TEST_CASE("a Trigger::when predicate calling back into its recorder gets an error, never a deadlock",
          "[sdk][hostile][triggers]") {
  using Call = std::function<void(Recorder&)>;
  const torch::Tensor large = torch::ones({1 << 18});  // 1 MiB, four times the staging buffers below
  const std::vector<std::pair<std::string, Call>> calls{
      {"flush", [](Recorder& r) { r.flush(); }},
      {"close", [](Recorder& r) { r.close(); }},
      {"capture", [&](Recorder& r) { r.capture("from_predicate", large); }},
      {"step", [](Recorder& r) { r.step(100); }},
      {"dump", [](Recorder& r) { r.dump(); }},
  };
  for (const auto& [what, call] : calls) {
    INFO(what);
    TempDir dir;
    const std::string run = dir / "run";
    Recorder* self = nullptr;
    std::string seen;
    const auto predicate = [&, call = call](const tensortap::TensorSummary& s) {
      if (s.name != "x" || self == nullptr) return false;
      try {
        call(*self);
        seen = "no error";
      } catch (const tensortap::Error& e) {
        seen = e.what();
      }
      return false;
    };
    must_end(
        [&] {
          Recorder rec{Options(run).buffer_bytes(256 << 10).stats_every(1).flight_recorder(2).dump_on(
              tensortap::Trigger::when(predicate))};
          self = &rec;
          rec.step(0);
          rec.capture("x", torch::ones({16}));
          rec.flush();
          rec.close();
          self = nullptr;
        },
        30, "a recorder whose predicate calls " + what);
    CHECK_THAT(seen, Catch::Contains("writer thread"));
    // The real close() finished the run.
    CHECK_THAT(tt_test::read_file(run + "/run.json"), Catch::Contains("\"closed\": true"));
  }
}

TEST_CASE("overwrite over a run of another layout removes that run's files, and only those",
          "[sdk][hostile][distributed]") {
  TempDir dir;
  const auto run_as = [&](std::int64_t rank, std::int64_t world, bool overwrite) {
    Recorder rec{Options(dir.path).rank(rank).world_size(world).overwrite(overwrite)};
    rec.step(0);
    rec.capture("x", torch::ones({2}));
    rec.close();
  };
  for (int r = 0; r < 4; ++r) run_as(r, 4, false);
  { std::ofstream(dir / "rank3/notes.txt") << "the user's"; }
  // A two-rank rerun: rank2 goes, rank3 keeps only the user's file.
  for (int r = 0; r < 2; ++r) run_as(r, 2, true);
  CHECK_FALSE(fs::exists(dir / "rank2"));
  CHECK_FALSE(fs::exists(dir / "rank3/run.json"));
  CHECK_FALSE(fs::exists(dir / "rank3/index.jsonl"));
  CHECK(fs::exists(dir / "rank3/notes.txt"));
  CHECK(fs::exists(dir / "rank1/run.json"));
  // A single-rank run over them: refused without overwrite, naming a rank.
  CHECK_THAT(error_of([&] { run_as(0, 1, false); }), Catch::Contains("rank"));
  run_as(0, 1, true);
  CHECK(fs::exists(dir / "run.json"));
  CHECK_FALSE(fs::exists(dir / "rank0"));
  CHECK_FALSE(fs::exists(dir / "rank1"));
  // And a multi-rank run over a single-rank root: the root's files go.
  CHECK_THAT(error_of([&] { run_as(0, 2, false); }), Catch::Contains("run.json"));
  for (int r = 0; r < 2; ++r) run_as(r, 2, true);
  CHECK_FALSE(fs::exists(dir / "run.json"));
  CHECK_FALSE(fs::exists(dir / "index.jsonl"));
  CHECK_FALSE(fs::exists(dir / "npy"));
  CHECK(fs::exists(dir / "rank0/run.json"));
}

TEST_CASE("a record larger than flight_recorder_bytes is dropped before it is copied, its statistics kept",
          "[sdk][hostile][flight]") {
  TempDir dir;
  const torch::Tensor big = torch::ones({64 << 20});  // 256 MiB, allocated before the peak is read
  const auto peak_kb = [] {
    struct rusage u {};
    getrusage(RUSAGE_SELF, &u);
    return static_cast<std::int64_t>(u.ru_maxrss);
  };
  const std::int64_t before = peak_kb();
  {
    Recorder rec{Options(dir.path).buffer_bytes(1 << 20).stats_every(1).flight_recorder(2).flight_recorder_bytes(
        1 << 20)};
    rec.step(0);
    rec.capture("big", big);
    rec.capture("small", torch::ones({16}));
    rec.close();
    CHECK(rec.counters().dropped == 1);
    CHECK(rec.counters().stats_rows == 2);  // the big one's statistics still taken
  }
  // Before: the record was assembled whole on the writer thread (+256 MiB),
  // then dropped. Now memory stays within a few staging buffers.
  CHECK(peak_kb() - before < 64 * 1024);
}

TEST_CASE("a large non-contiguous tensor is streamed chunk by chunk, never copied whole", "[sdk][hostile]") {
  TempDir dir;
  // Allocated before the peak is read: 128 MiB, seen transposed; 128 MiB
  // more that an expanded view claims with 4 bytes; bfloat16, stored as
  // float32 (a dtype conversion per chunk), transposed.
  const torch::Tensor base = torch::arange(1 << 25, torch::kFloat32).reshape({1 << 12, 1 << 13});
  const torch::Tensor transposed = base.t();
  const torch::Tensor expanded = torch::full({1}, 3.5f).expand({1 << 25});
  const torch::Tensor bf16 = torch::arange(1 << 21, torch::kFloat32).reshape({1 << 10, 1 << 11}).to(torch::kBFloat16).t();
  // A 3-d view whose chunks start and end inside rows and planes.
  const torch::Tensor odd = torch::arange(3 * 1001 * 997, torch::kFloat64).reshape({3, 1001, 997}).permute({2, 0, 1});
  const auto peak_kb = [] {
    struct rusage u {};
    getrusage(RUSAGE_SELF, &u);
    return static_cast<std::int64_t>(u.ru_maxrss);
  };
  const std::int64_t before = peak_kb();
  {
    Recorder rec{Options(dir.path).buffer_bytes(1 << 20)};
    rec.step(0);
    rec.capture("transposed", transposed);
    rec.capture("expanded", expanded);
    rec.capture("bf16", bf16);
    rec.capture("odd", odd);
    rec.close();
    REQUIRE(rec.counters().records == 4);
    REQUIRE(rec.counters().errors == 0);
  }
  // Before: each was first made contiguous, +128 MiB at a time. Now memory
  // stays within a few staging buffers.
  CHECK(peak_kb() - before < 32 * 1024);
  const auto read = [&](const std::string& name) {
    return tensortap::load_npy(dir / ("npy/tensor/" + name + "/00000000.npy"));
  };
  CHECK(torch::equal(read("transposed"), transposed));
  CHECK(torch::equal(read("expanded"), expanded));
  CHECK(torch::equal(read("bf16"), bf16.to(torch::kFloat32)));
  CHECK(torch::equal(read("odd"), odd));
}

TEST_CASE("a tensor of absurd logical size is refused with its name before anything is copied", "[sdk][hostile]") {
  TempDir dir;
  Recorder rec{Options(dir.path).buffer_bytes(1 << 20)};
  rec.step(0);
  rec.capture("before", torch::ones({4}));
  // 2^46 elements (256 TiB) of one float: more than any disk this runs on
  // has. It was a raw c10::Error from the allocator naming no tensor. Round
  // 4 threw it as the caller's error; issue 57 counts it under on_error as
  // a full disk's, as a Tap's record is (README, "Errors"): no throw into
  // the loop, and close() rethrows it with the tensor's name.
  const torch::Tensor huge = torch::ones({1}).expand({std::int64_t{1} << 46});
  CHECK_NOTHROW(rec.capture("huge", huge));
  CHECK(rec.counters().errors == 1);
  // 2^62 elements of 16 bytes: more bytes than 64 bits count.
  const torch::Tensor wide =
      torch::ones({1, 1}, torch::kComplexDouble).expand({std::int64_t{1} << 31, std::int64_t{1} << 31});
  CHECK_THAT(error_of([&] { rec.capture("wide", wide); }),
             Catch::Contains("'wide'") && Catch::Contains("64 bits") && Catch::Contains("complex128"));
  rec.capture("after", torch::ones({4}));
  CHECK_THAT(error_of([&] { rec.close(); }), Catch::Contains("'huge'") &&
                                                 Catch::Contains("281474976710656 bytes") &&
                                                 Catch::Contains("whole file system"));
  // Nothing already captured is lost, nor anything after.
  CHECK(rec.counters().records == 2);
  CHECK(fs::exists(dir / "npy/tensor/before/00000000.npy"));
  CHECK(fs::exists(dir / "npy/tensor/after/00000000.npy"));
}
