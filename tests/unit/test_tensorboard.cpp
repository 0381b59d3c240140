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
#include <set>
#include <string>
#include <vector>

#include <catch2/catch.hpp>
#include <torch/torch.h>

#include <tensortap/tensortap.h>

#include "tests/support/helpers.h"
#include "tests/support/net.h"
#include "sdk/src/sinks/tensorboard.h"
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

// What a test needs of an event, read from its protobuf wire form here
// (the generated messages cannot be included beside LibTorch, whose wheels
// ship protobuf headers of another version): the step and each summary
// value's tag and what it holds.
struct Value {
  std::string tag;
  char what = '?';  // 's' simple_value, 'h' histogram, 't' tensor
  float simple = 0;
  std::string plugin;
};
struct ParsedEvent {
  std::int64_t step = 0;
  std::vector<Value> values;
};

std::uint64_t varint(const std::string& s, std::size_t& at) {
  std::uint64_t v = 0;
  for (int shift = 0;; shift += 7) {
    REQUIRE(at < s.size());
    const auto b = static_cast<unsigned char>(s[at++]);
    v |= static_cast<std::uint64_t>(b & 0x7Fu) << shift;
    if ((b & 0x80u) == 0) return v;
  }
}

// Calls f(field, wire type, payload) for each field of the message `s`
// (payload: the bytes of a length-delimited or fixed field, the varint's
// value as text otherwise).
template <typename F>
void fields(const std::string& s, F&& f) {
  std::size_t at = 0;
  while (at < s.size()) {
    const std::uint64_t key = varint(s, at);
    const auto wire = static_cast<int>(key & 7u);
    const auto field = static_cast<int>(key >> 3);
    if (wire == 0) {
      f(field, wire, std::to_string(varint(s, at)));
    } else {
      const std::size_t n = wire == 2 ? static_cast<std::size_t>(varint(s, at)) : wire == 1 ? 8 : 4;
      REQUIRE((wire == 1 || wire == 2 || wire == 5));
      REQUIRE(at + n <= s.size());
      f(field, wire, s.substr(at, n));
      at += n;
    }
  }
}

ParsedEvent parse_event(const std::string& bytes) {
  ParsedEvent e;
  fields(bytes, [&](int field, int, const std::string& p) {
    if (field == 2) e.step = static_cast<std::int64_t>(std::stoull(p));
    if (field != 5) return;
    fields(p, [&](int vf, int, const std::string& vp) {
      if (vf != 1) return;
      Value v;
      fields(vp, [&](int f, int, const std::string& q) {
        if (f == 1) v.tag = q;
        if (f == 2) {
          v.what = 's';
          std::memcpy(&v.simple, q.data(), 4);
        }
        if (f == 5) v.what = 'h';
        if (f == 8) v.what = 't';
        if (f == 9) fields(q, [&](int, int, const std::string& pd) {
            fields(pd, [&](int pf, int, const std::string& name) {
              if (pf == 1) v.plugin = name;
            });
          });
      });
      e.values.push_back(v);
    });
  });
  return e;
}

// Every value of the run's one event file, with its event's step.
std::vector<std::pair<std::int64_t, Value>> values_in(const std::string& run) {
  const std::vector<std::string> files = event_files(run);
  REQUIRE(files.size() == 1);
  std::vector<std::pair<std::int64_t, Value>> out;
  for (const std::string& bytes : frames(tt_test::read_file(files[0]))) {
    const ParsedEvent e = parse_event(bytes);
    for (const Value& v : e.values) out.emplace_back(e.step, v);
  }
  return out;
}

// The steps at which `tag` has a value of `what`, and the values.
std::vector<std::pair<std::int64_t, float>> series_of(const std::vector<std::pair<std::int64_t, Value>>& values,
                                                      const std::string& tag, char what = 's') {
  std::vector<std::pair<std::int64_t, float>> out;
  for (const auto& [step, v] : values)
    if (v.tag == tag && v.what == what) out.emplace_back(step, v.simple);
  return out;
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
  for (const char* tag : {"grad/fc.weight/norm", "grad/fc.bias/mean", "activation/out/std", "tensor/loss"})
    CHECK(bytes.find(tag) != std::string::npos);
  // run.json records the settings.
  CHECK(tt_test::read_file(run + "/run.json")
            .find("\"tensorboard\": {\"histograms_every\": 2, \"stats\": [\"mean\", \"std\", \"min\", \"max\", "
                  "\"norm\"]}") != std::string::npos);
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

TEST_CASE("KeepLatest's event files roll at a step's first event, also after a dump's line at a later step",
          "[tensorboard]") {
  // A dump's line comes at the training thread's step, which the records
  // the writer thread is at may be far behind: the file rolled only at a
  // step above its highest, so it never rolled again and grew past the
  // budget (the soak check: 612 KB in one file under a 2 MiB budget).
  tt_test::TempDir tmp;
  const tensortap::detail::Dir dir = tensortap::detail::Dir::open(tmp.path, /*create=*/false);
  tensortap::detail::TensorBoard tb(dir, TensorBoardOptions{});
  constexpr std::uint64_t kFileBytes = 16384;
  tb.keep_latest(kFileBytes);
  const std::string line(1000, 'x');
  const auto step = [&](std::int64_t s) {
    for (int i = 0; i < 4; ++i) tb.text(s, "t", line);
  };
  for (std::int64_t s = 0; s < 10; ++s) step(s);
  tb.text(1000, "tensortap/dumps", "{\"step\": 1000, \"reason\": \"request\", \"steps\": []}");
  for (std::int64_t s = 10; s < 60; ++s) step(s);
  tb.flush(/*durable=*/false);
  std::vector<std::uintmax_t> sizes;
  for (const auto& e : fs::directory_iterator(tmp.path)) sizes.push_back(fs::file_size(e.path()));
  // 60 steps of about 4 KB: a file a little over 16 KB each, none holding
  // more than its size and one step's events.
  CHECK(sizes.size() >= 12);
  CHECK(*std::max_element(sizes.begin(), sizes.end()) < kFileBytes + 4 * (line.size() + 100));
  // The file with the line at step 1000 stays until step 1000 is given up;
  // the others go with their steps.
  CHECK(tb.give_up(40) > 0);
  std::size_t left = 0;
  for (const auto& e : fs::directory_iterator(tmp.path)) left += e.is_regular_file() ? 1 : 0;
  CHECK(left < sizes.size());
  CHECK(left >= 5);
  tb.close();
}

TEST_CASE("TensorBoard's defaults: five statistics, nonfinite from the first NaN, a 0-d tensor as one scalar",
          "[tensorboard]") {
  // Issue 47: ten charts a tensor, half of them flat counts, and ten more
  // for the loss (the mean of a scalar), before the loss itself.
  tt_test::TempDir tmp;
  const std::string run = tmp / "run";
  {
    tensortap::Recorder rec(Options(run).stats_every(1).tensorboard(TensorBoardOptions().histograms_every(1)));
    for (int64_t s = 0; s < 5; ++s) {
      rec.step(s);
      torch::Tensor x = torch::ones({4});
      if (s == 2) x[1] = std::numeric_limits<float>::quiet_NaN();
      if (s == 3) x[0] = -std::numeric_limits<float>::infinity();
      rec.capture("x", x);
      rec.capture("loss", torch::tensor(0.25 * static_cast<double>(s + 1)));
    }
    rec.close();
    REQUIRE(rec.counters().errors == 0);
  }
  const auto values = values_in(run);
  for (const char* stat : {"mean", "std", "min", "max", "norm"})
    CHECK(series_of(values, std::string("tensor/x/") + stat).size() == 5);
  for (const char* stat : {"nan", "posinf", "neginf", "zeros", "numel"}) {
    CHECK(series_of(values, std::string("tensor/x/") + stat).empty());
    CHECK(series_of(values, std::string("tensor/loss/") + stat).empty());
  }
  // nonfinite: absent before step 2, then every step, 0 included.
  CHECK(series_of(values, "tensor/x/nonfinite") ==
        std::vector<std::pair<std::int64_t, float>>{{2, 1.0F}, {3, 1.0F}, {4, 0.0F}});
  CHECK(series_of(values, "tensor/x/mean")[2].second == 1.0F);  // over the finite values
  // The loss: one scalar a step, no statistics, no histogram; x's histograms.
  CHECK(series_of(values, "tensor/loss") ==
        std::vector<std::pair<std::int64_t, float>>{{0, 0.25F}, {1, 0.5F}, {2, 0.75F}, {3, 1.0F}, {4, 1.25F}});
  for (const char* stat : {"mean", "std", "min", "max", "norm", "nonfinite"})
    CHECK(series_of(values, std::string("tensor/loss/") + stat).empty());
  CHECK(series_of(values, "tensor/loss", 'h').empty());
  CHECK(series_of(values, "tensor/x", 'h').size() == 5);
  // The custom scalars layout, by its plugin, once: both names came in the
  // first batch (the layout's content: the next cases).
  std::size_t layouts = 0;
  for (const auto& [step, v] : values)
    if (v.tag == "custom_scalars__config__") {
      ++layouts;
      CHECK(v.what == 't');
      CHECK(v.plugin == "custom_scalars");
    }
  CHECK(layouts >= 1);
}

TEST_CASE("the custom scalars layout at a real model's size: a chart per 0-d tensor, 16 series a chart by module",
          "[tensorboard]") {
  // Issue 58: 36 gradient norms in one chart (a solid block), the loss in a
  // chart with lr and grad_norm. EVENTS.md, "The layout".
  using tensortap::detail::tb::custom_layout;
  using tensortap::detail::tb::regex_escape;
  std::vector<std::string> grads;
  for (int i = 0; i < 20; ++i) grads.push_back("enc." + std::to_string(i) + ".weight");
  for (int i = 0; i < 12; ++i) grads.push_back("dec." + std::to_string(i) + ".weight");
  for (const char* n : {"G/0.weight", "G/0.bias", "head.weight", "head.bias"}) grads.push_back(n);
  REQUIRE(grads.size() == 36);
  const auto layout = custom_layout({"lr", "loss", "grad_norm", "loss"}, grads, {"enc.0", "dec.0"});
  REQUIRE(layout.size() == 3);
  // One chart per 0-d tensor, the loss first, then by name; anchored, escaped.
  REQUIRE(layout[0].charts.size() == 3);
  CHECK(layout[0].charts[0].title == "loss");
  CHECK(layout[0].charts[0].tags == std::vector<std::string>{"^tensor/loss$"});
  CHECK(layout[0].charts[1].title == "grad_norm");
  CHECK(layout[0].charts[2].title == "lr");
  // The gradients by top-level module (its first component, at '.' or
  // '/'), at most 16 a chart, in name order.
  const auto& charts = layout[1].charts;
  std::vector<std::string> titles;
  for (const auto& c : charts) titles.push_back(c.title);
  CHECK(titles == std::vector<std::string>{"G", "dec", "enc (1/2)", "enc (2/2)", "head"});
  for (const auto& c : charts) CHECK(c.tags.size() <= 16);
  CHECK(charts[2].tags.size() == 16);
  CHECK(charts[3].tags.size() == 4);
  CHECK(charts[0].tags == std::vector<std::string>{"^grad/G/0\\.bias/norm$", "^grad/G/0\\.weight/norm$"});
  std::size_t series = 0;
  for (const auto& c : charts) series += c.tags.size();
  CHECK(series == 36);
  CHECK(layout[2].title == "tensortap: activations' std");
  CHECK(layout[2].charts.size() == 2);
  // One top-level module holding everything: split at the second component.
  const auto one = custom_layout({}, {"model.enc.w", "model.dec.w", "model.bias"}, {});
  REQUIRE(one.size() == 1);
  std::vector<std::string> one_titles;
  for (const auto& c : one[0].charts) one_titles.push_back(c.title);
  CHECK(one_titles == std::vector<std::string>{"model.bias", "model.dec", "model.enc"});
  // Groups by module name, whatever sorts between a module's names.
  const auto dash = custom_layout({}, {"enc.w", "enc-dec.w", "enc", "x.w"}, {});
  std::vector<std::string> dash_titles;
  for (const auto& c : dash[0].charts) dash_titles.push_back(c.title);
  CHECK(dash_titles == std::vector<std::string>{"enc", "enc-dec", "x"});
  CHECK(dash[0].charts[0].tags.size() == 2);
  // What Python's re.escape escapes, and nothing else.
  CHECK(regex_escape("a.b/c-d(e)[f]{g}?*+|^$\\&~# x") ==
        "a\\.b/c\\-d\\(e\\)\\[f\\]\\{g\\}\\?\\*\\+\\|\\^\\$\\\\\\&\\~\\#\\ x");
  // No statistics of a category: no category.
  CHECK(custom_layout({"loss"}, {}, {}).size() == 1);
}

TEST_CASE("the recorder writes the layout again when a name first seen later needs a chart", "[tensorboard]") {
  tt_test::TempDir tmp;
  const std::string run = tmp / "run";
  {
    tensortap::Recorder rec(Options(run).stats_every(1).tensorboard(true));
    for (int64_t s = 0; s < 6; ++s) {
      rec.step(s);
      rec.capture("loss", torch::tensor(1.0));
      if (s >= 3) rec.capture("lr", torch::tensor(0.1));  // a 0-d tensor first seen at step 3
      rec.flush();
    }
    rec.close();
  }
  std::vector<std::int64_t> layout_steps;
  std::int64_t highest = 0;
  for (const auto& [step, v] : values_in(run)) {
    if (v.tag == "custom_scalars__config__") {
      // Never below a step written before it: TensorBoard would purge.
      CHECK(step >= highest);
      layout_steps.push_back(step);
    }
    highest = std::max(highest, step);
  }
  CHECK(layout_steps == std::vector<std::int64_t>{0, 3});
}

TEST_CASE("TensorBoardOptions::stats: all ten write the counts as they are; a subset; a bad name is refused",
          "[tensorboard]") {
  tt_test::TempDir tmp;
  const std::vector<std::string> all = {"min", "max", "mean", "std", "norm", "nan", "posinf", "neginf", "zeros", "numel"};
  const auto record = [&](const std::string& run, const TensorBoardOptions& tb) {
    tensortap::Recorder rec(Options(run).stats_every(1).tensorboard(tb));
    for (int64_t s = 0; s < 3; ++s) {
      rec.step(s);
      torch::Tensor x = torch::zeros({4});
      if (s == 1) x[1] = std::numeric_limits<float>::quiet_NaN();
      rec.capture("x", x);
    }
    rec.close();
  };
  record(tmp / "all", TensorBoardOptions().stats(all));
  auto values = values_in(tmp / "all");
  for (const std::string& stat : all) CHECK(series_of(values, "tensor/x/" + stat).size() == 3);
  CHECK(series_of(values, "tensor/x/nan") == std::vector<std::pair<std::int64_t, float>>{{0, 0.0F}, {1, 1.0F}, {2, 0.0F}});
  CHECK(series_of(values, "tensor/x/zeros")[0].second == 4.0F);
  CHECK(series_of(values, "tensor/x/nonfinite").empty());
  CHECK(tt_test::read_file(tmp / "all/run.json").find("\"stats\": [\"min\", \"max\", \"mean\", \"std\", \"norm\", "
                                                      "\"nan\", \"posinf\", \"neginf\", \"zeros\", \"numel\"]") !=
        std::string::npos);

  record(tmp / "two", TensorBoardOptions().stats({"norm", "zeros"}));
  values = values_in(tmp / "two");
  std::set<std::string> tags;
  for (const auto& [step, v] : values)
    if (v.what == 's') tags.insert(v.tag);
  CHECK(tags == std::set<std::string>{"tensor/x/norm", "tensor/x/zeros", "tensor/x/nonfinite"});

  // None: only nonfinite, when it comes; twice the same: written once.
  record(tmp / "none", TensorBoardOptions().stats({}));
  values = values_in(tmp / "none");
  tags.clear();
  for (const auto& [step, v] : values)
    if (v.what == 's') tags.insert(v.tag);
  CHECK(tags == std::set<std::string>{"tensor/x/nonfinite"});
  record(tmp / "twice", TensorBoardOptions().stats({"mean", "mean"}));
  CHECK(series_of(values_in(tmp / "twice"), "tensor/x/mean").size() == 3);

  const std::string err = tt_test::error_of(
      [&] { tensortap::Recorder rec(Options(tmp / "bad").tensorboard(TensorBoardOptions().stats({"mean", "median"}))); });
  CHECK(err.find("TensorBoardOptions::stats: 'median' is not a statistic") != std::string::npos);
  CHECK_FALSE(fs::exists(tmp / "bad/run.json"));
}

TEST_CASE("TensorBoard: a 0-d tensor in a statistics-only run is its one scalar, NaN and Inf included",
          "[tensorboard]") {
  // No record is stored (every(0)): only the statistics row's work reaches
  // the writer thread with the bytes, and the loss must still be
  // tensor/<name>, not five statistics of one value. (A CUDA 0-d tensor is
  // sent as its element, not its statistics vector: tests/cuda/test_cuda.cpp.)
  tt_test::TempDir tmp;
  const std::string run = tmp / "run";
  {
    tensortap::Recorder rec(Options(run).every(0).stats_every(1).tensorboard(true));
    const float loss[] = {0.75F, std::numeric_limits<float>::infinity(), std::numeric_limits<float>::quiet_NaN()};
    for (int64_t s = 0; s < 3; ++s) {
      rec.step(s);
      rec.capture("loss", torch::tensor(loss[s]));
      rec.capture("one", torch::full({1}, 2.0F));  // not 0-d: its statistics
    }
    rec.close();
    REQUIRE(rec.counters().errors == 0);
  }
  const auto values = values_in(run);
  const auto loss = series_of(values, "tensor/loss");
  REQUIRE(loss.size() == 3);
  CHECK(loss[0] == std::pair<std::int64_t, float>{0, 0.75F});
  CHECK((loss[1].first == 1 && loss[1].second == std::numeric_limits<float>::infinity()));
  CHECK((loss[2].first == 2 && std::isnan(loss[2].second)));
  for (const auto& [step, v] : values) CHECK(v.tag.rfind("tensor/loss/", 0) != 0);
  CHECK(series_of(values, "tensor/one/mean").size() == 3);
  CHECK(tt_test::read_lines(run + "/index.jsonl").empty());
}
