// TensorBoard's event files (Options::tensorboard): the CRC, the framing,
// the file's name and the rules every file of a run follows. What the events
// say is checked with TensorBoard's own reader (tests/python/test_tensorboard.py).
#include <fcntl.h>
#include <signal.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include <catch2/catch.hpp>
#include <torch/torch.h>

#include <tensortap/tensortap.h>

#include "tests/support/helpers.h"
#include "tests/support/net.h"
#include "sdk/src/pipeline/tensorboard.h"
#include "writers/src/file.h"
#include "writers/src/run_dir.h"
#include "writers/src/tensorboard/crc32c.h"
#include "writers/src/tensorboard/event_file.h"
#include "writers/src/tensorboard/events.h"

namespace fs = std::filesystem;
using tensortap::Options;
using tensortap::TensorBoardOptions;

namespace {

std::uint64_t le(const std::string& s, std::size_t at, int bytes) {
  std::uint64_t v = 0;
  for (int i = 0; i < bytes; ++i) v |= static_cast<std::uint64_t>(static_cast<unsigned char>(s[at + i])) << (8 * i);
  return v;
}

std::uint32_t masked_by_table(const char* p, std::size_t n) {
  const std::uint32_t c = tensortap::detail::crc32c_table(p, n);
  return ((c >> 15) | (c << 17)) + 0xa282ead8u;
}

// The events of a file as TFRecord framing holds them; every length and
// every CRC checked by the table (not the code under test's instruction).
std::vector<std::string> frames(const std::string& bytes) {
  std::vector<std::string> out;
  std::size_t at = 0;
  while (at < bytes.size()) {
    REQUIRE(bytes.size() - at >= 12);
    const std::uint64_t n = le(bytes, at, 8);
    REQUIRE(le(bytes, at + 8, 4) == masked_by_table(bytes.data() + at, 8));
    REQUIRE(bytes.size() - at - 12 >= n + 4);
    out.push_back(bytes.substr(at + 12, n));
    REQUIRE(le(bytes, at + 12 + n, 4) == masked_by_table(bytes.data() + at + 12, n));
    at += 12 + n + 4;
  }
  return out;
}

std::vector<std::string> event_files(const std::string& dir) {
  std::vector<std::string> found;
  for (const auto& e : fs::directory_iterator(dir))
    if (tensortap::detail::is_event_file_name(e.path().filename().string())) found.push_back(e.path().string());
  return found;
}

std::string host() {
  char buf[256] = {};
  ::gethostname(buf, sizeof buf - 1);
  return buf;
}

}  // namespace

TEST_CASE("crc32c: the Castagnoli check value, and the instruction agrees with the table", "[tensorboard]") {
  using tensortap::detail::crc32c;
  using tensortap::detail::crc32c_table;
  const char* check = "123456789";
  CHECK(crc32c(check, 9) == 0xE3069283u);
  CHECK(crc32c_table(check, 9) == 0xE3069283u);
  CHECK(crc32c("", 0) == 0);
  std::mt19937 gen(7);
  std::vector<char> buf(5000);
  for (char& c : buf) c = static_cast<char>(gen());
  // Every length to 70 at every alignment to 8, and a long one: the 8-byte
  // loop, its tail and the byte loop.
  for (std::size_t off = 0; off < 8; ++off)
    for (std::size_t n = 0; n <= 70; ++n) REQUIRE(crc32c(buf.data() + off, n) == crc32c_table(buf.data() + off, n));
  CHECK(crc32c(buf.data(), buf.size()) == crc32c_table(buf.data(), buf.size()));
  // Continued in two parts: the same as in one.
  CHECK(crc32c(buf.data() + 1000, 4000, crc32c(buf.data(), 1000)) == crc32c(buf.data(), 5000));
}

TEST_CASE("histogram buckets: the logarithm's guess lands where std::upper_bound does", "[tensorboard]") {
  // The limits as EVENTS.md builds them, here independently.
  std::vector<double> pos;
  for (double v = 1e-12; v < 1e20; v *= 1.1) pos.push_back(v);
  pos.push_back(std::numeric_limits<double>::max());
  std::vector<double> limits;
  for (auto it = pos.rbegin(); it != pos.rend(); ++it) limits.push_back(-*it);
  limits.push_back(0.0);
  limits.insert(limits.end(), pos.begin(), pos.end());
  const auto expected = [&](double x) {
    const auto at = static_cast<std::size_t>(std::upper_bound(limits.begin(), limits.end(), x) - limits.begin());
    return std::min(at, limits.size() - 1);
  };
  std::vector<double> xs = {0.0, -0.0, 1e-300, -1e-300, 5e-324, 1e-12, -1e-12, 1e20, -1e20, 1e300, -1e300,
                            std::numeric_limits<double>::max(), std::numeric_limits<double>::lowest()};
  for (double l : limits)
    for (double x : {l, std::nextafter(l, 0.0), std::nextafter(l, std::numeric_limits<double>::infinity()),
                     std::nextafter(l, -std::numeric_limits<double>::infinity())})
      xs.push_back(x);
  std::mt19937_64 gen(11);
  std::uniform_real_distribution<double> exponent(-320, 308);
  for (int i = 0; i < 100000; ++i) xs.push_back((i % 2 ? -1 : 1) * std::pow(10.0, exponent(gen)));
  std::normal_distribution<double> normal;
  for (int i = 0; i < 100000; ++i) xs.push_back(normal(gen));
  std::size_t wrong = 0;
  for (double x : xs)
    if (std::isfinite(x) && tensortap::detail::histogram_bucket(x) != expected(x)) ++wrong;
  CHECK(wrong == 0);
}

TEST_CASE("event files: TFRecord framing and the file's name", "[tensorboard]") {
  std::string out;
  tensortap::detail::tb::append_framed(out, "abc");
  REQUIRE(out.size() == 8 + 4 + 3 + 4);
  CHECK(le(out, 0, 8) == 3);
  CHECK(frames(out) == std::vector<std::string>{"abc"});
  CHECK(tensortap::detail::event_file_name(1234, "my.host/x y", 42) ==
        "events.out.tfevents.0000001234.my_host_x_y.42.tensortap");
  CHECK(tensortap::detail::event_file_name(1, "", 7) == "events.out.tfevents.0000000001.localhost.7.tensortap");
  CHECK(tensortap::detail::is_event_file_name("events.out.tfevents.0000001234.h.42.tensortap"));
  CHECK_FALSE(tensortap::detail::is_event_file_name("events.out.tfevents.0000001234.h.42"));
  CHECK_FALSE(tensortap::detail::is_event_file_name("events.out.tfevents.tensortap"));
}

TEST_CASE("Options::tensorboard: one event file of whole events, tagged as TensorBoard expects", "[tensorboard]") {
  tt_test::TempDir tmp;
  const std::string run = tmp / "run";
  {
    tt_test::Net net;
    auto rec = tensortap::watch(*net, Options(run).stats_every(1).tensorboard(TensorBoardOptions().histograms_every(2)));
    for (int64_t s = 0; s < 4; ++s) {
      rec->step(s);
      net->forward(torch::ones({4, 3})).sum().backward();
      rec->capture("loss", torch::tensor(0.5 * static_cast<double>(s)));
    }
    rec->close();
    CHECK(rec->counters().errors == 0);
  }
  const std::vector<std::string> files = event_files(run);
  REQUIRE(files.size() == 1);
  const std::string bytes = tt_test::read_file(files[0]);
  const std::vector<std::string> events = frames(bytes);
  // The file version, then per step: a statistics event per tensor (fc.weight
  // and fc.bias grads and params? the kinds watched), tensor/loss, and
  // histograms at steps 0 and 2.
  REQUIRE(events.size() > 8);
  CHECK(events[0].find("brain.Event:2") != std::string::npos);
  for (const char* tag : {"grad/fc.weight/norm", "grad/fc.bias/nan", "activation/out/mean", "tensor/loss/max",
                          "tensor/loss"})
    CHECK(bytes.find(tag) != std::string::npos);
  // run.json records the setting.
  CHECK(tt_test::read_file(run + "/run.json").find("\"tensorboard\": {\"histograms_every\": 2}") != std::string::npos);
}

TEST_CASE("a 0-d tensor named like a statistic's tag is said once, naming both", "[tensorboard]") {
  // Round 4: a 0-d tensor named "x/norm" gets the tag of the norm statistic
  // of tensor "x" (the tag scheme is fixed, DESIGN sections 8 and 9), and
  // the two charts mixed without a word. Either may come first.
  tt_test::TempDir tmp;
  for (const bool scalar_first : {false, true}) {
    const std::string run = tmp / (scalar_first ? "scalar_first" : "statistics_first");
    const std::string err = tt_test::stderr_of(tmp / "stderr", [&] {
      tensortap::Recorder rec(Options(run).stats_every(1).tensorboard(true));
      for (int64_t s = 0; s < 3; ++s) {
        rec.step(s);
        if (scalar_first) rec.capture("x/norm", torch::tensor(1.5));
        rec.capture("x", torch::ones({4}));
        if (!scalar_first) rec.capture("x/norm", torch::tensor(1.5));
        rec.capture("y/size", torch::tensor(2.0));  // not a statistic's name
        rec.capture("y", torch::ones({4}));
        rec.flush();
      }
      rec.close();
    });
    const std::string said = "the 0-d tensor 'x/norm' and the statistics of the tensor 'x' both write the TensorBoard "
                             "tag 'tensor/x/norm'";
    CHECK(err.find(said) != std::string::npos);
    CHECK(err.find(said) == err.rfind(said));  // once
    CHECK(err.find("'y/size'") == std::string::npos);
  }
}

TEST_CASE("Options::tensorboard: a link planted at the event file's name is refused, nothing outside is written",
          "[tensorboard]") {
  tt_test::TempDir tmp;
  const std::string run = tmp / "run", outside = tmp / "outside";
  { std::ofstream(outside) << "keep"; }
  fs::create_directories(run);
  // The name holds the second it is made: plant one for each second the
  // recorder could start in.
  const auto now = static_cast<std::int64_t>(::time(nullptr));
  for (std::int64_t t = now - 1; t <= now + 5; ++t)
    fs::create_symlink(outside, run + "/" + tensortap::detail::event_file_name(t, host(), ::getpid()));
  const std::string err = tt_test::error_of([&] { tensortap::Recorder rec(Options(run).tensorboard(true)); });
  CHECK(err.find("events.out.tfevents.") != std::string::npos);
  CHECK(err.find("in the way") != std::string::npos);
  CHECK(tt_test::read_file(outside) == "keep");
  // With overwrite, the links go (never followed) and the run starts.
  {
    tensortap::Recorder rec(Options(run).tensorboard(true).overwrite(true));
    rec.step(0);
    rec.capture("x", torch::ones({3}));
    rec.close();
  }
  CHECK(tt_test::read_file(outside) == "keep");
  for (const auto& f : event_files(run)) CHECK_FALSE(fs::is_symlink(f));
  CHECK(event_files(run).size() == 1);
}

TEST_CASE("Options::overwrite removes the old run's event files and leaves other event files", "[tensorboard]") {
  tt_test::TempDir tmp;
  const std::string run = tmp / "run";
  for (int i = 0; i < 2; ++i) {
    tensortap::Recorder rec(Options(run).tensorboard(true).overwrite(true));
    rec.step(0);
    rec.capture("x", torch::ones({3}));
    rec.close();
    if (i == 0) { std::ofstream(run + "/events.out.tfevents.1.user-host") << "a user's own"; }
  }
  CHECK(event_files(run).size() == 1);
  CHECK(fs::exists(run + "/events.out.tfevents.1.user-host"));
}

TEST_CASE("Options::tensorboard: bad settings are refused when the recorder is made", "[tensorboard]") {
  tt_test::TempDir tmp;
  const std::string err = tt_test::error_of(
      [&] { tensortap::Recorder rec(Options(tmp / "run").tensorboard(TensorBoardOptions().histograms_every(-1))); });
  CHECK(err.find("TensorBoardOptions::histograms_every(-1)") != std::string::npos);
  CHECK_FALSE(fs::exists(tmp / "run/run.json"));
}

TEST_CASE("event files: a write that fails is cut back to whole events, and later events still go in",
          "[tensorboard]") {
  tt_test::TempDir tmp;
  const tensortap::detail::Dir dir = tensortap::detail::Dir::open(tmp.path, /*create=*/false);
  tensortap::detail::EventFile file(dir);
  const std::uint64_t start = file.size();
  REQUIRE(start > 0);
  // A file size limit makes the next write fail part way (EFBIG; SIGXFSZ
  // ignored), as a full disk would.
  struct sigaction ignore {}, old {};
  ignore.sa_handler = SIG_IGN;
  ::sigaction(SIGXFSZ, &ignore, &old);
  rlimit saved{};
  ::getrlimit(RLIMIT_FSIZE, &saved);
  rlimit small = saved;
  small.rlim_cur = start + 100;
  REQUIRE(::setrlimit(RLIMIT_FSIZE, &small) == 0);
  file.append(tensortap::detail::tb::text_event(1.0, 1, "t", std::string(1000, 'x')));
  const std::string err = tt_test::error_of([&] { file.flush(false); });
  ::setrlimit(RLIMIT_FSIZE, &saved);
  ::sigaction(SIGXFSZ, &old, nullptr);
  CHECK(err.find(file.path()) != std::string::npos);
  CHECK(file.size() == start);
  CHECK(fs::file_size(file.path()) == start);
  file.append(tensortap::detail::tb::text_event(2.0, 2, "t", "after"));
  file.flush(true);
  file.close();
  const std::vector<std::string> events = frames(tt_test::read_file(file.path()));
  REQUIRE(events.size() == 2);
  CHECK(events[1].find("after") != std::string::npos);
}
