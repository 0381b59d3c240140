// Flight-recorder triggers beyond NaN: each rule on synthetic series fires at
// the right step (short windows, ties, cooldowns), never on a clean run, and
// what a dump records.
#include <sys/stat.h>

#include <cmath>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include <ATen/ATen.h>

#include <tensortap/tensortap.h>

#include "tests/support/helpers.h"
#include "sdk/src/flight/triggers.h"

using tensortap::AfterDump;
using tensortap::Kind;
using tensortap::Options;
using tensortap::Recorder;
using tensortap::TensorSummary;
using tensortap::Trigger;
using tensortap::detail::Triggers;
using tt_test::TempDir;

namespace {

TensorSummary summary(std::int64_t step, const std::string& name, double mean, double norm = 1.0,
                      Kind kind = Kind::Tensor) {
  TensorSummary s;
  s.step = step;
  s.kind = kind;
  s.name = name;
  s.mean = mean;
  s.min = s.max = mean;
  s.norm = norm;
  s.numel = 1;
  return s;
}

// What Triggers::evaluate fired first on a row.
std::optional<tensortap::Dump> first(std::vector<tensortap::Dump> fired) {
  if (fired.empty()) return std::nullopt;
  return std::move(fired.front());
}

// The steps at which `rules` fire on `values` of the tensor "loss".
std::vector<std::int64_t> fires(Options options, const std::vector<double>& values) {
  Triggers t(options.stats_every(1));
  std::vector<std::int64_t> out;
  std::string error;
  for (std::size_t i = 0; i < values.size(); ++i) {
    const auto s = static_cast<std::int64_t>(i);
    if (first(t.evaluate(summary(s, "loss", values[i], values[i]), false, error))) out.push_back(s);
  }
  REQUIRE(error.empty());
  return out;
}

using tt_test::error_of;

}  // namespace

TEST_CASE("spike fires when a value passes factor x the median of its window, once per run", "[sdk][triggers]") {
  std::vector<double> clean(100, 1.0);
  for (std::size_t i = 0; i < clean.size(); ++i) clean[i] = 1.0 + 0.1 * std::sin(static_cast<double>(i));
  REQUIRE(fires(Options("x").dump_on(Trigger::spike("loss", 5.0, 50)), clean).empty());

  auto spiky = clean;
  spiky[60] = 8.0;  // a spike that recovers
  spiky[80] = 9.0;  // a second one: the rule has fired already
  REQUIRE(fires(Options("x").dump_on(Trigger::spike("loss", 5.0, 50)), spiky) == std::vector<std::int64_t>{60});
  // With a cooldown it fires again once that many steps have passed.
  REQUIRE(fires(Options("x").dump_on(Trigger::spike("loss", 5.0, 50).cooldown(10)), spiky) ==
          std::vector<std::int64_t>{60, 80});
  REQUIRE(fires(Options("x").dump_on(Trigger::spike("loss", 5.0, 50).cooldown(30)), spiky) ==
          std::vector<std::int64_t>{60});
  // Another tensor's values are not the rule's business.
  REQUIRE(fires(Options("x").dump_on(Trigger::spike("acc", 5.0, 50)), spiky).empty());
}

TEST_CASE("spike's window: shorter than the history, ties, and its first steps", "[sdk][triggers]") {
  // Window 3: the median of the last three values only (1), so 40 fires;
  // over the whole history (window 8) the median is 10, and 40 does not.
  const std::vector<double> v = {10, 10, 10, 10, 1, 1, 1, 40};
  REQUIRE(fires(Options("x").dump_on(Trigger::spike("loss", 5.0, 3)), v) == std::vector<std::int64_t>{7});
  REQUIRE(fires(Options("x").dump_on(Trigger::spike("loss", 5.0, 8)), v).empty());
  // A tie (exactly factor x median) does not fire; just above does.
  REQUIRE(fires(Options("x").dump_on(Trigger::spike("loss", 5.0, 4)), {2, 2, 2, 10}).empty());
  REQUIRE(fires(Options("x").dump_on(Trigger::spike("loss", 5.0, 4)), {2, 2, 2, 10.0001}) ==
          std::vector<std::int64_t>{3});
  // Even counts take the mean of the two middle values, as numpy.median:
  // the median of 2, 2, 4, 4 is 3, so the threshold is 6.
  REQUIRE(fires(Options("x").dump_on(Trigger::spike("loss", 2.0, 4)), {2, 2, 4, 4, 6.1}) ==
          std::vector<std::int64_t>{4});
  REQUIRE(fires(Options("x").dump_on(Trigger::spike("loss", 2.0, 4)), {2, 2, 4, 4, 6}).empty());
  REQUIRE(fires(Options("x").dump_on(Trigger::spike("loss", 2.0, 4)), {2, 2, 4, 4, 5}).empty());
  // Fewer than min(window, 3) earlier values: no verdict yet.
  REQUIRE(fires(Options("x").dump_on(Trigger::spike("loss", 5.0, 50)), {1, 100, 100}).empty());
  // Magnitudes: a loss that swings negative counts by its size.
  REQUIRE(fires(Options("x").dump_on(Trigger::spike("loss", 5.0, 3)), {-1, 1, -1, -7}) == std::vector<std::int64_t>{3});
}

TEST_CASE("norm_jump watches every series on its own, and when() any predicate", "[sdk][triggers]") {
  Triggers t(Options("x").stats_every(1).dump_on(Trigger::norm_jump(10.0, 20)));
  std::string error;
  std::int64_t fired_at = -1;
  std::string fired_name;
  for (std::int64_t s = 0; s < 40; ++s) {
    // "a" is large and steady; "b" small and steady until it jumps 20x at 30.
    const bool a = first(t.evaluate(summary(s, "a", 0, 500.0, Kind::Grad), false, error)).has_value();
    auto b = first(t.evaluate(summary(s, "b", 0, s == 30 ? 20.0 : 1.0, Kind::Grad), false, error));
    REQUIRE_FALSE(a);
    if (b) {
      fired_at = b->step;
      fired_name = b->name;
      REQUIRE(b->value == 20.0);
      REQUIRE(b->median == 1.0);
      REQUIRE(b->trigger == "norm_jump");
    }
  }
  REQUIRE(fired_at == 30);
  REQUIRE(fired_name == "b");

  Triggers w(Options("x").stats_every(1).dump_on(
      Trigger::when([](const TensorSummary& s) { return s.kind == Kind::Activation && s.max > 1e4; })));
  REQUIRE_FALSE(first(w.evaluate(summary(0, "h", 2e4, 1, Kind::Tensor), false, error)));
  REQUIRE(first(w.evaluate(summary(1, "h", 2e4, 1, Kind::Activation), false, error))->trigger == "when");
  REQUIRE(error.empty());
}

TEST_CASE("a predicate that throws is an error, its rule goes off, nothing crashes", "[sdk][triggers]") {
  TempDir dir;
  Recorder rec{
      Options(dir.path).stats_every(1).flight_recorder(3).dump_on(Trigger::when([](const TensorSummary& s) -> bool {
        if (s.step == 2) throw std::runtime_error("bad predicate");
        return false;
      }))};
  for (std::int64_t s = 0; s < 5; ++s) {
    rec.step(s);
    rec.capture("x", at::ones({2}));
  }
  REQUIRE_THAT(error_of([&] { rec.flush(); }),
               Catch::Contains("Trigger::when threw") && Catch::Contains("bad predicate") && Catch::Contains("step 2"));
  REQUIRE_THAT(error_of([&] { rec.close(); }), Catch::Contains("bad predicate"));
  REQUIRE(rec.counters().dumps == 0);
  REQUIRE(rec.counters().errors == 0);   // no record was lost to it
  REQUIRE(rec.counters().records == 0);  // the flight recorder held them; nothing fired
}

TEST_CASE("Options refuse triggers without the statistics they need, and malformed ones", "[sdk][triggers]") {
  TempDir dir;
  REQUIRE_THAT(
      error_of([&] { Recorder r{Options(dir.path).flight_recorder(5).dump_on(Trigger::spike("loss", 5, 50))}; }),
      Catch::Contains("Trigger::spike(\"loss\", 5, 50)") && Catch::Contains("stats_every"));
  REQUIRE_THAT(error_of([&] { Recorder r{Options(dir.path).dump_on(Trigger::non_finite())}; }),
               Catch::Contains("stats_every"));
  REQUIRE_THAT(error_of([&] { Recorder r{Options(dir.path).stats_every(1).dump_on(Trigger::norm_jump(0.5, 20))}; }),
               Catch::Contains("factor"));
  REQUIRE_THAT(error_of([&] { Recorder r{Options(dir.path).stats_every(1).dump_on(Trigger::spike("x", 5, 0))}; }),
               Catch::Contains("window"));
  REQUIRE_THAT(
      error_of([&] { Recorder r{Options(dir.path).stats_every(1).dump_on(Trigger::spike("x", 5, 5).cooldown(-1))}; }),
      Catch::Contains("cooldown"));
  REQUIRE_THAT(error_of([&] { Recorder r{Options(dir.path).stats_every(1).dump_on(Trigger::when(nullptr))}; }),
               Catch::Contains("predicate"));
  // non_finite with a flight recorder needs no statistics: it scans what it holds.
  Recorder ok{Options(dir.path).flight_recorder(5).dump_on(Trigger::non_finite())};
}

TEST_CASE("a loss spike dumps the steps before it, run.json says which rule fired, and dumps() shows it",
          "[sdk][triggers]") {
  TempDir dir;
  Recorder rec{Options(dir.path)
                   .stats_every(1)
                   .flight_recorder(4)
                   .after_dump(AfterDump::Continue)
                   .dump_on(Trigger::spike("loss", 5.0, 10))};
  std::int64_t seen_at = -1;
  for (std::int64_t s = 0; s < 30; ++s) {
    rec.step(s);
    if (seen_at < 0 && !rec.dumps().empty()) seen_at = s;
    rec.capture("w", at::full({3}, static_cast<double>(s)));
    rec.capture("loss", at::full({}, s == 20 ? 50.0 : 1.0 + 0.25 * static_cast<double>(s % 3)));
    rec.flush();  // the writer sees step s before step s + 1 begins
  }
  rec.close();
  REQUIRE(seen_at == 21);  // at the next step()
  const auto dumps = rec.dumps();
  REQUIRE(dumps.size() == 1);
  REQUIRE(dumps[0].step == 20);
  REQUIRE(dumps[0].trigger == "spike");
  REQUIRE(dumps[0].name == "loss");
  REQUIRE(dumps[0].value == 50.0);
  REQUIRE(dumps[0].steps == std::vector<std::int64_t>{16, 17, 18, 19, 20});
  const std::string run_json = tt_test::read_file(dir / "run.json");
  REQUIRE_THAT(run_json, Catch::Contains("\"step\": 20, \"reason\": \"spike\", \"steps\": [16,17,18,19,20], "
                                         "\"kind\": \"tensor\", \"name\": \"loss\", \"trigger\": {\"kind\": \"spike\", "
                                         "\"factor\": 5, \"window\": 10}, \"value\": 50, \"median\": 1.25"));
  // The held steps' tensors are on disk.
  REQUIRE(tt_test::index_lines_with(dir.path, "\"name\":\"w\"").size() == 5);
}

TEST_CASE(
    "a rule that fires on every step appends one line per dump to dumps.jsonl, and run.json is written at open and "
    "close only",
    "[sdk][triggers][flight]") {
  // Issue 30 item 7: each dump rewrote the whole run.json (every dump so
  // far) and step() copied the whole list: 8,000 dumps made 3.7 GB of
  // writes. Now a dump is one line, and run.json lists them once, at close.
  TempDir dir;
  constexpr std::int64_t kSteps = 300;
  Recorder rec{Options(dir.path)
                   .stats_every(1)
                   .flight_recorder(2)
                   .after_dump(AfterDump::Continue)
                   .dump_on(Trigger::when([](const TensorSummary&) { return true; }).cooldown(1))};
  struct stat early {};
  std::string early_text;
  for (std::int64_t s = 0; s < kSteps; ++s) {
    rec.step(s);
    // As of this step(): the dumps of every step before it.
    REQUIRE(rec.dumps().size() == static_cast<std::size_t>(s));
    rec.capture("loss", at::full({}, 1.0));
    rec.flush();  // the writer sees step s, and dumps, before step s + 1 begins
    if (s == 5) {
      REQUIRE(::stat((dir / "run.json").c_str(), &early) == 0);
      early_text = tt_test::read_file(dir / "run.json");
    }
  }
  // While the run is open: run.json is the one written at open, the same
  // file (a rewrite renames a new one into place) with the same bytes.
  struct stat late {};
  REQUIRE(::stat((dir / "run.json").c_str(), &late) == 0);
  CHECK(late.st_ino == early.st_ino);
  CHECK(late.st_size == early.st_size);
  REQUIRE(tt_test::read_file(dir / "run.json") == early_text);
  REQUIRE_THAT(early_text, Catch::Contains("\"dumps\": []") && Catch::Contains("\"closed\": false"));
  // dumps.jsonl has every dump so far, one whole line each, in order.
  const auto lines = tt_test::read_lines(dir / "dumps.jsonl");
  REQUIRE(lines.size() == static_cast<std::size_t>(kSteps));
  for (std::size_t i = 0; i < lines.size(); ++i) {
    INFO("line " << i + 1 << ": " << lines[i]);
    const std::string starts = "{\"step\": " + std::to_string(i) + ", \"reason\": \"when\", \"steps\": [";
    REQUIRE_THAT(lines[i], Catch::StartsWith(starts) && Catch::Contains("\"trigger\": {\"kind\": \"when\"}") &&
                               Catch::EndsWith("}"));
  }
  rec.close();
  // After close, Recorder::dumps() has them all, and run.json lists each
  // once, in the form of its line: one rendering for both.
  const auto dumps = rec.dumps();
  REQUIRE(dumps.size() == static_cast<std::size_t>(kSteps));
  for (std::size_t i = 0; i < dumps.size(); ++i) REQUIRE(dumps[i].step == static_cast<std::int64_t>(i));
  const std::string closed = tt_test::read_file(dir / "run.json");
  REQUIRE_THAT(closed, Catch::Contains("\"closed\": true"));
  std::size_t listed = 0;
  for (std::size_t at = closed.find("\"reason\": \"when\""); at != std::string::npos;
       at = closed.find("\"reason\": \"when\"", at + 1))
    ++listed;
  REQUIRE(listed == static_cast<std::size_t>(kSteps));
  for (const auto& line : lines) REQUIRE_THAT(closed, Catch::Contains(line));
  // Still one line per dump: close() appends nothing.
  REQUIRE(tt_test::read_lines(dir / "dumps.jsonl").size() == static_cast<std::size_t>(kSteps));
}

TEST_CASE("without a flight recorder a trigger marks the run, and Throw still stops it", "[sdk][triggers]") {
  TempDir dir;
  {
    Recorder rec{Options(dir.path).every(0).stats_every(1).dump_on(Trigger::norm_jump(10.0, 5).cooldown(3))};
    for (std::int64_t s = 0; s < 20; ++s) {
      rec.step(s);
      rec.capture("g", at::full({4}, s == 10 || s == 16 ? 100.0 : 1.0));
      rec.flush();
    }
    rec.close();
    const auto dumps = rec.dumps();
    REQUIRE(dumps.size() == 2);  // 10, and 16 after the cooldown
    REQUIRE(dumps[0].step == 10);
    REQUIRE(dumps[1].step == 16);
    REQUIRE(dumps[0].steps.empty());
    REQUIRE(rec.counters().records == 0);
    REQUIRE_THAT(tt_test::read_file(dir / "run.json"), Catch::Contains("\"reason\": \"norm_jump\", \"steps\": []"));
  }
  TempDir dir2;
  Recorder rec{Options(dir2.path)
                   .every(0)
                   .stats_every(1)
                   .after_dump(AfterDump::Throw)
                   .dump_on(Trigger::when([](const TensorSummary& s) { return s.max > 10; }))};
  std::string err;
  for (std::int64_t s = 0; s < 10 && err.empty(); ++s) {
    err = error_of([&] {
      rec.step(s);
      rec.capture("g", at::full({4}, s == 5 ? 100.0 : 1.0));
      rec.flush();
    });
  }
  REQUIRE_THAT(err, Catch::Contains("a trigger fired") && Catch::Contains("Trigger::when") &&
                        Catch::Contains("step 5") && Catch::Contains("'g'"));
}

TEST_CASE("spike keeps a history per kind: a Tap's activation and its gradient are two series (round 4)",
          "[sdk][triggers]") {
  // A Tap named "loss": its activation is 0.1 and its gradient 1.0 at every
  // step. One median of both (0.55) made 1.0 a spike of factor 1.5.
  Triggers t(Options("x").stats_every(1).dump_on(Trigger::spike("loss", 1.5, 20)));
  std::string error;
  for (std::int64_t s = 0; s < 40; ++s) {
    INFO("step " << s);
    REQUIRE_FALSE(first(t.evaluate(summary(s, "loss", 0.1, 1, Kind::Activation), false, error)));
    REQUIRE_FALSE(first(t.evaluate(summary(s, "loss", 1.0, 1, Kind::ActivationGrad), false, error)));
  }
  // Each series still fires on its own jump.
  auto d = first(t.evaluate(summary(40, "loss", 2.0, 1, Kind::ActivationGrad), false, error));
  REQUIRE(d);
  CHECK(d->kind == Kind::ActivationGrad);
  CHECK(d->median == 1.0);
}

TEST_CASE("cooldown(INT64_MAX) fires once, not every step (no overflow in the cooldown check)", "[sdk][triggers]") {
  const std::vector<double> values{1, 1, 1, 100, 100, 100, 100, 100};
  auto spike = Trigger::spike("loss", 5.0, 3);
  REQUIRE(fires(Options("x").dump_on(spike.cooldown(INT64_MAX)), values) == std::vector<std::int64_t>{3});
  // Steps near the top of the range, a cooldown that would pass 2^63 too.
  Triggers t(Options("x").stats_every(1).dump_on(Trigger::norm_jump(2.0, 3).cooldown(INT64_MAX - 5)));
  std::string error;
  std::vector<std::int64_t> fired;
  for (std::int64_t s = (std::int64_t{1} << 46); s < (std::int64_t{1} << 46) + 8; ++s) {
    const double v = s - (std::int64_t{1} << 46) < 3 ? 1.0 : 50.0;
    if (first(t.evaluate(summary(s, "w", v, v), false, error))) fired.push_back(s);
  }
  REQUIRE(fired == std::vector<std::int64_t>{(std::int64_t{1} << 46) + 3});
}

TEST_CASE("spike and norm_jump fire on a NaN or Inf of what they watch, and explicit rules replace the default",
          "[sdk][triggers]") {
  Triggers spike(Options("x").stats_every(1).flight_recorder(4).dump_on(Trigger::spike("loss", 5.0, 50)));
  std::string error;
  for (std::int64_t s = 0; s < 5; ++s) REQUIRE_FALSE(first(spike.evaluate(summary(s, "loss", 1.0), false, error)));
  // The statistics of a NaN loss: no finite value, one NaN.
  TensorSummary nan_loss = summary(5, "loss", 0.0, 0.0);
  nan_loss.nan = 1;
  auto d = first(spike.evaluate(nan_loss, false, error));
  REQUIRE(d);
  CHECK(d->trigger == "spike");
  CHECK(d->reason == "nan");
  CHECK(std::isnan(d->value));
  // Even with no history at all, and for Inf.
  Triggers fresh(Options("x").stats_every(1).dump_on(Trigger::spike("loss", 5.0, 50)));
  TensorSummary inf_loss = summary(0, "loss", 0.0, 0.0);
  inf_loss.posinf = 1;
  d = first(fresh.evaluate(inf_loss, false, error));
  REQUIRE(d);
  CHECK(d->reason == "inf");

  Triggers jump(Options("x").stats_every(1).dump_on(Trigger::norm_jump(10.0, 5)));
  TensorSummary inf_grad = summary(0, "fc.weight", 0.0, 0.0, Kind::Grad);
  inf_grad.neginf = 3;
  REQUIRE(first(jump.evaluate(inf_grad, false, error)));

  // An explicit rule replaces the default non_finite rule: a NaN elsewhere
  // does not fire a spike on "loss"; naming non_finite() keeps it.
  Triggers only_spike(Options("x").stats_every(1).flight_recorder(4).dump_on(Trigger::spike("loss", 5.0, 50)));
  TensorSummary nan_act = summary(0, "hidden", 0.0, 0.0, Kind::Activation);
  nan_act.nan = 1;
  CHECK_FALSE(first(only_spike.evaluate(nan_act, false, error)));
  Triggers both(Options("x")
                    .stats_every(1)
                    .flight_recorder(4)
                    .dump_on(Trigger::spike("loss", 5.0, 50))
                    .dump_on(Trigger::non_finite()));
  CHECK(first(both.evaluate(nan_act, false, error)));
  REQUIRE(error.empty());
}

TEST_CASE("norm_jump and spike do not fire against a median of zero", "[sdk][triggers]") {
  // A gradient of exact zeros for a while (a frozen layer, a masked head),
  // then a tiny one: no ratio, no dump.
  std::vector<double> zeros_then_tiny(20, 0.0);
  zeros_then_tiny.push_back(2e-30);
  zeros_then_tiny.push_back(1e-300);
  CHECK(fires(Options("x").dump_on(Trigger::norm_jump(10.0, 20)), zeros_then_tiny).empty());
  CHECK(fires(Options("x").dump_on(Trigger::spike("loss", 10.0, 20)), zeros_then_tiny).empty());
  // Subnormal medians are no better.
  std::vector<double> subnormal(10, 4e-320);
  subnormal.push_back(1e-300);
  CHECK(fires(Options("x").dump_on(Trigger::norm_jump(10.0, 10)), subnormal).empty());
  // A real jump from a real median still fires.
  std::vector<double> real(10, 1e-3);
  real.push_back(1.0);
  CHECK(fires(Options("x").dump_on(Trigger::norm_jump(10.0, 10)), real) == std::vector<std::int64_t>{10});
}

// -- the training health rules, live (issue 62; their definition: the
// docstring of python/tensortap/_doctor.py) -----------------------------------

namespace {

// A row of `numel` elements with the statistics given.
TensorSummary row(std::int64_t step, Kind kind, const std::string& name, double std_, double norm,
                  std::int64_t zeros = 0, std::int64_t numel = 100, double lo = -1, double hi = 1) {
  TensorSummary s;
  s.step = step;
  s.kind = kind;
  s.name = name;
  s.min = lo;
  s.max = hi;
  s.std = std_;
  s.norm = norm;
  s.zeros = zeros;
  s.numel = numel;
  return s;
}

// The steps at which the rules of `options` fire on `rows`, and the dumps.
std::vector<tensortap::Dump> health_fires(Options options, const std::vector<TensorSummary>& rows) {
  Triggers t(options.stats_every(1));
  std::vector<tensortap::Dump> out;
  std::string error;
  for (const TensorSummary& s : rows)
    for (tensortap::Dump& d : t.evaluate(s, false, error)) out.push_back(std::move(d));
  REQUIRE(error.empty());
  return out;
}

std::vector<std::int64_t> steps_of(const std::vector<tensortap::Dump>& dumps) {
  std::vector<std::int64_t> out;
  for (const auto& d : dumps) out.push_back(d.step);
  return out;
}

}  // namespace

TEST_CASE("a health rule fires where the doctor's episode opens: the patience-th evaluation in a row, once an episode",
          "[sdk][triggers][health]") {
  // dead_relu, patience 3: the fraction of zeros above 0.95 at steps 0, 1
  // (a run of 2), 3, 4, 5 (fires at 5), then one miss bridged (6), another
  // alone (8), two in a row close it (8, 9); 10, 11, 12 open the next.
  const std::vector<bool> dead{true, true, false, true, true, true, false, true, false, false, true, true, true};
  std::vector<TensorSummary> rows;
  for (std::size_t i = 0; i < dead.size(); ++i)
    rows.push_back(row(static_cast<std::int64_t>(i), Kind::Activation, "relu1", 1, 1, dead[i] ? 99 : 50));
  // A ReLU's input is never judged; nor a name the include does not find.
  for (std::size_t i = 0; i < dead.size(); ++i) {
    rows.push_back(row(static_cast<std::int64_t>(i), Kind::Activation, "relu1_input", 1, 1, 100));
    rows.push_back(row(static_cast<std::int64_t>(i), Kind::Activation, "gelu1", 1, 1, 100));
  }
  const auto fired = health_fires(Options("x").dump_on(Trigger::dead_relu().cooldown(1)), rows);
  REQUIRE(steps_of(fired) == std::vector<std::int64_t>{5, 12});
  CHECK(fired[0].trigger == "dead_relu");
  CHECK(fired[0].reason == "dead_relu");
  CHECK(fired[0].name == "relu1");
  CHECK(fired[0].value == 0.99);
  CHECK(fired[0].threshold == 0.95);
  // Once per run by default (cooldown 0), a setter changes the rule.
  CHECK(steps_of(health_fires(Options("x").dump_on(Trigger::dead_relu()), rows)) == std::vector<std::int64_t>{5});
  CHECK(steps_of(health_fires(Options("x").dump_on(Trigger::dead_relu().patience(1).threshold(0.98)), rows)) ==
        std::vector<std::int64_t>{0});
}

TEST_CASE("each health rule's measure, from statistics rows", "[sdk][triggers][health]") {
  std::vector<TensorSummary> rows;
  SECTION("vanishing_gradient: RMS below 1e-7 on weights' gradients, three in a row; biases left out") {
    for (std::int64_t s = 0; s < 5; ++s) {
      rows.push_back(row(s, Kind::Grad, "fc1.weight", 0, s < 1 ? 1.0 : 1e-7));  // RMS 1e-8 from step 1
      rows.push_back(row(s, Kind::Grad, "fc1.bias", 0, 0));
    }
    const auto f = health_fires(Options("x").dump_on(Trigger::vanishing_gradient()), rows);
    REQUIRE(steps_of(f) == std::vector<std::int64_t>{3});
    CHECK(f[0].name == "fc1.weight");
    CHECK(f[0].value == Approx(1e-8));
  }
  SECTION("all_zero: a parameter's first row is its initialization") {
    for (std::int64_t s = 0; s < 4; ++s) rows.push_back(row(s, Kind::Param, "norm.bias", 0, 0, 100));
    CHECK(steps_of(health_fires(Options("x").dump_on(Trigger::all_zero()), rows)) == std::vector<std::int64_t>{2});
  }
  SECTION("unchanged_tensor: identical statistics while a gradient reached it; a frozen one never") {
    for (std::int64_t s = 0; s < 5; ++s) {
      rows.push_back(row(s, Kind::Param, "fc1.weight", 0.5, 3));
      rows.push_back(row(s, Kind::Param, "fc2.weight", 0.5, 3));  // frozen: no gradient rows
      rows.push_back(row(s, Kind::Grad, "fc1.weight", 0.1, 2));
    }
    const auto f = health_fires(Options("x").dump_on(Trigger::unchanged_tensor()), rows);
    REQUIRE(steps_of(f) == std::vector<std::int64_t>{2});
    CHECK(f[0].name == "fc1.weight");
    CHECK(f[0].value == 2);
  }
  SECTION("loss_not_decreasing: whole windows, the second no lower than the first") {
    for (std::int64_t s = 0; s < 6; ++s) rows.push_back(summary(s, "loss", 2.0));
    const auto f = health_fires(Options("x").dump_on(Trigger::loss_not_decreasing().window(2)), rows);
    REQUIRE(steps_of(f) == std::vector<std::int64_t>{3});
    CHECK(f[0].threshold == 0.001);
    // A loss that falls is not flagged.
    rows.clear();
    for (std::int64_t s = 0; s < 6; ++s) rows.push_back(summary(s, "loss", 2.0 - 0.1 * static_cast<double>(s)));
    CHECK(health_fires(Options("x").dump_on(Trigger::loss_not_decreasing().window(2)), rows).empty());
  }
  SECTION("saturated_activation: the bound from the statistics, a tanh's output and a sigmoid's") {
    for (std::int64_t s = 0; s < 3; ++s) {
      // tanh: every |y| = 0.99, past sqrt(0.9): the bound is 1.
      rows.push_back(row(s, Kind::Activation, "tanh1", 0.99, 0.99 * 10, 0, 100, -0.99, 0.99));
      // sigmoid: y = 0.5 everywhere (2y - 1 = 0): none saturated.
      TensorSummary sig = row(s, Kind::Activation, "sigmoid1", 0, 5, 0, 100, 0.5, 0.5);
      sig.mean = 0.5;
      rows.push_back(sig);
    }
    const auto f = health_fires(Options("x").dump_on(Trigger::saturated_activation()), rows);
    REQUIRE(steps_of(f) == std::vector<std::int64_t>{2});
    CHECK(f[0].name == "tanh1");
    CHECK(f[0].value == Approx(1.0));
  }
  SECTION("tensor_variance: a std 1000x the median of the earlier ones") {
    for (std::int64_t s = 0; s < 5; ++s) rows.push_back(row(s, Kind::Activation, "h", s == 4 ? 1000 : 1, 1));
    const auto f = health_fires(Options("x").dump_on(Trigger::tensor_variance()), rows);
    REQUIRE(steps_of(f) == std::vector<std::int64_t>{4});
    CHECK(f[0].value == 1000);
    CHECK(f[0].threshold == 100);
  }
  SECTION("exploding_tensor: the first exploding row of a blow-up; one quiet step bridges, two end it") {
    for (std::int64_t s = 0; s < 12; ++s) {
      TensorSummary r = row(s, Kind::Activation, "h", 1, 1);
      if (s == 3 || s == 4 || s == 6 || s == 9) r.nan = 1;
      rows.push_back(r);
    }
    const auto f = health_fires(Options("x").dump_on(Trigger::exploding_tensor().cooldown(1)), rows);
    REQUIRE(steps_of(f) == std::vector<std::int64_t>{3, 9});
    CHECK(f[0].value == 1);
    CHECK(f[0].threshold == 0);
  }
  SECTION("poor_weight_initialization: at the first step, the inputs' stds 50x apart, judged at the next step") {
    rows.push_back(row(0, Kind::Activation, "relu1_input", 1, 1));
    rows.push_back(row(0, Kind::Activation, "relu2_input", 50, 1));
    rows.push_back(row(0, Kind::Activation, "relu2", 50, 1));  // an output: not selected
    rows.push_back(row(1, Kind::Activation, "relu1_input", 1, 1));
    const auto f = health_fires(Options("x").dump_on(Trigger::poor_weight_initialization()), rows);
    REQUIRE(steps_of(f) == std::vector<std::int64_t>{0});
    CHECK(f[0].name == "relu2_input");
    CHECK(f[0].value == 50);
  }
}

TEST_CASE("health rules: parameters a rule lacks, out of range, or a rule only the doctor evaluates, are refused by "
          "name",
          "[sdk][triggers][health]") {
  const auto refused = [](Trigger t) {
    TempDir dir;
    return error_of([&] { Recorder rec(Options(dir / "r").stats_every(1).dump_on(t)); });
  };
  CHECK_THAT(refused(Trigger::dead_relu().bound(1)), Catch::Contains("dead_relu has no parameter bound"));
  CHECK_THAT(refused(Trigger::spike("loss", 5, 10).window(3)), Catch::Contains("spike has no parameter window"));
  CHECK_THAT(refused(Trigger::dead_relu().threshold(1.5)),
             Catch::Contains("threshold 1.5 is not a number between 0 and 1"));
  CHECK_THAT(refused(Trigger::unchanged_tensor().num_steps(1)), Catch::Contains("num_steps 1 is not an integer >= 2"));
  CHECK_THAT(refused(Trigger::vanishing_gradient().kinds(tensortap::KindSet::none())), Catch::Contains("kinds"));
  CHECK_THAT(refused(Trigger::all_zero().include("(")),
             Catch::Contains("include '(' is not a regular expression"));
  CHECK_THAT(refused(Trigger::weight_update_ratio()), Catch::Contains("offline only (tensortap doctor)"));
  // Like every rule, they need statistics.
  TempDir dir;
  CHECK_THAT(error_of([&] { Recorder rec(Options(dir / "r").dump_on(Trigger::dead_relu())); }),
             Catch::Contains("Trigger::dead_relu()") && Catch::Contains("stats_every"));
}

TEST_CASE("a health rule's firing is a dumps.jsonl line with its value and threshold, and run.json names its "
          "parameters",
          "[sdk][triggers][health]") {
  TempDir dir;
  {
    Recorder rec(Options(dir / "run").stats_every(1).dump_on(Trigger::all_zero().kinds({Kind::Tensor}).patience(2)));
    for (std::int64_t s = 0; s < 3; ++s) {
      rec.step(s);
      rec.capture("z", at::zeros({8}));
    }
    rec.flush();
    rec.step(3);  // where a dump made on the writer thread is seen
    const auto dumps = rec.dumps();
    REQUIRE(dumps.size() == 1);
    CHECK(dumps[0].trigger == "all_zero");
    CHECK(dumps[0].step == 1);
    CHECK(dumps[0].threshold == 1.0);
    rec.close();
  }
  const std::string line = tt_test::read_file(dir / "run/dumps.jsonl");
  CHECK_THAT(line, Catch::Contains("\"reason\": \"all_zero\"") && Catch::Contains("\"name\": \"z\"") &&
                       Catch::Contains("\"trigger\": {\"kind\": \"all_zero\"}") &&
                       Catch::Contains("\"value\": 1, \"threshold\": 1"));
  CHECK_THAT(tt_test::read_file(dir / "run/run.json"),
             Catch::Contains("{\"kind\": \"all_zero\", \"kinds\": [\"tensor\"], \"include\": \"\", \"patience\": 2, "
                             "\"cooldown\": 0}"));
}
