// Settings from the environment (issue 59, DESIGN section 10): TENSORTAP=off
// and TENSORTAP_OPTIONS, parsed strictly.
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <regex>
#include <set>
#include <sstream>
#include <string>

#include <catch2/catch.hpp>
#include <torch/torch.h>

#include <tensortap/tensortap.h>

#include "sdk/src/sinks/option_table.h"
#include "sdk/src/run/environment.h"
#include "tests/support/helpers.h"

namespace fs = std::filesystem;
using tensortap::Kind;
using tensortap::Options;
using tensortap::detail::apply_options_text;
using tt_test::error_of;
using tt_test::TempDir;

namespace {

// Sets (or, with nullptr, unsets) an environment variable for a scope.
struct Env {
  std::string name;
  Env(const char* n, const char* value) : name(n) {
    if (value != nullptr)
      ::setenv(n, value, 1);
    else
      ::unsetenv(n);
  }
  ~Env() { ::unsetenv(name.c_str()); }
};

Options parsed(const std::string& text) {
  Options o("code/dir");
  apply_options_text(o, text);
  return o;
}

}  // namespace

TEST_CASE("TENSORTAP_OPTIONS: every kind of value, key by key over what the code set", "[sdk][environment]") {
  const Options o = parsed(
      " every=100 , kinds=grad+activation, stats_every=1,flight_recorder=20,max_bytes=50G,"
      "every.grad=10, stop=none, start=2, include=^enc\\,dec$, exclude=a\\.b, format=packed,"
      "packed.segment_bytes=256MiB, tensorboard=1, tensorboard.histograms_every=5, tensorboard.stats=mean+norm,"
      "on_budget=keep_latest, stall_after=10m, overflow=drop_newest, on_error=stop, after_dump=throw,"
      "capture_eval=on, buffer_bytes=8k, steps=0+4+9, ranks=0, overwrite=true, hdf5.deflate=3");
  CHECK(o.every() == 100);
  CHECK(o.kinds().contains(Kind::Grad));
  CHECK(o.kinds().contains(Kind::Activation));
  CHECK_FALSE(o.kinds().contains(Kind::Tensor));
  CHECK(o.stats_every() == 1);
  CHECK(o.flight_recorder() == 20);
  CHECK(o.max_bytes() == (std::size_t{50} << 30));
  CHECK(o.every(Kind::Grad) == 10);
  CHECK(o.every(Kind::Activation) == 100);
  CHECK_FALSE(o.stop().has_value());
  CHECK(o.start() == 2);
  CHECK(o.include() == "^enc,dec$");   // \, is a comma inside a value
  CHECK(o.exclude() == "a\\.b");      // any other backslash stays
  CHECK(o.format() == tensortap::Format::Packed);
  CHECK(o.packed().segment_bytes() == (std::size_t{256} << 20));
  REQUIRE(o.tensorboard().has_value());
  CHECK(o.tensorboard()->histograms_every() == 5);
  CHECK(o.tensorboard()->stats() == std::vector<std::string>{"mean", "norm"});
  CHECK(o.on_budget() == tensortap::Budget::KeepLatest);
  CHECK(o.stall_after() == std::chrono::minutes(10));
  CHECK(o.overflow() == tensortap::Overflow::DropNewest);
  CHECK(o.on_error() == tensortap::OnError::Stop);
  CHECK(o.after_dump() == tensortap::AfterDump::Throw);
  CHECK(o.capture_eval());
  CHECK(o.buffer_bytes() == 8192);
  CHECK(o.steps() == std::vector<std::int64_t>{0, 4, 9});
  CHECK(o.ranks() == std::vector<std::int64_t>{0});
  CHECK(o.overwrite());
  CHECK(o.hdf5().deflate() == 3);
  CHECK(o.dir() == "code/dir");  // what the text did not name stays as the code set it
  // The last of a key given twice wins; sizes and durations in every unit.
  CHECK(parsed("every=3,every=7").every() == 7);
  CHECK(parsed("max_bytes=2T").max_bytes() == (std::size_t{2} << 40));
  CHECK(parsed("max_bytes=2kib").max_bytes() == 2048);
  CHECK(parsed("max_bytes=17").max_bytes() == 17);
  CHECK(parsed("stall_after=90").stall_after() == std::chrono::seconds(90));
  CHECK(parsed("stall_after=250ms").stall_after() == std::chrono::milliseconds(250));
  CHECK(parsed("stall_after=2h").stall_after() == std::chrono::hours(2));
  CHECK(parsed("stop=12").stop() == 12);
  CHECK_FALSE(parsed("tensorboard=off").tensorboard().has_value());
  CHECK(parsed("dir=runs/elsewhere").dir() == "runs/elsewhere");
  CHECK(parsed("").every() == 1);
  CHECK(parsed(" , ,every=4,").every() == 4);
}

TEST_CASE("TENSORTAP_OPTIONS: a key or value it does not understand is refused, by name", "[sdk][environment]") {
  const auto refused = [](const std::string& text) { return error_of([&] { parsed(text); }); };
  CHECK_THAT(refused("evry=10"), Catch::Contains("TENSORTAP_OPTIONS: evry=10: an unknown key"));
  CHECK_THAT(refused("every=ten"), Catch::Contains("every=ten: expected a non-negative integer"));
  CHECK_THAT(refused("every=-1"), Catch::Contains("every=-1"));
  CHECK_THAT(refused("overwrite=yes"), Catch::Contains("overwrite=yes: expected a boolean"));
  CHECK_THAT(refused("format=csv"), Catch::Contains("format=csv: expected one of npy, hdf5, packed"));
  CHECK_THAT(refused("kinds=grad+weights"), Catch::Contains("'weights' is not a kind"));
  CHECK_THAT(refused("kinds=grad++tensor"), Catch::Contains("an empty item"));
  CHECK_THAT(refused("every.gradient=2"), Catch::Contains("'gradient' is not a kind"));
  CHECK_THAT(refused("max_bytes=5X"), Catch::Contains("max_bytes=5X: expected a size"));
  CHECK_THAT(refused("max_bytes=9223372036854775808"), Catch::Contains("too large"));  // 2^63
  CHECK_THAT(refused("max_bytes=9000000000T"), Catch::Contains("too large"));
  CHECK_THAT(refused("stall_after=366d"), Catch::Contains("expected a duration"));
  CHECK_THAT(refused("stall_after=9000h"), Catch::Contains("longer than a year"));
  CHECK_THAT(refused("dump_on=non_finite"), Catch::Contains("set in code"));
  CHECK_THAT(refused("every"), Catch::Contains("'every' is not key=value"));
  CHECK_THAT(refused("=3"), Catch::Contains("has no key"));
}

TEST_CASE("TENSORTAP_OPTIONS applies when a recorder is made, and run.json says so", "[sdk][environment]") {
  TempDir dir;
  {
    const Env env("TENSORTAP_OPTIONS", "every=3,kinds=grad+tensor");
    tensortap::Recorder rec{Options(dir.path).every(1)};
    CHECK(rec.options().every() == 3);
    CHECK_FALSE(rec.options().kinds().contains(Kind::Activation));
    rec.close();
  }
  const std::string j = tt_test::read_file(dir / "run.json");
  CHECK_THAT(j, Catch::Contains("\"every\": 3,") && Catch::Contains("\"kinds\": [\"grad\", \"tensor\"]") &&
                    Catch::Contains("\"options_from_env\": \"every=3,kinds=grad+tensor\""));
  // Unset: null. A bad key: the recorder refuses to start, naming it.
  TempDir plain;
  tensortap::Recorder rec{Options(plain.path)};
  rec.close();
  CHECK_THAT(tt_test::read_file(plain / "run.json"), Catch::Contains("\"options_from_env\": null"));
  const Env bad("TENSORTAP_OPTIONS", "every=3,color=blue");
  TempDir refused;
  CHECK_THAT(error_of([&] { tensortap::Recorder r{Options(refused.path)}; }), Catch::Contains("color=blue"));
  torch::nn::Linear fc(2, 2);
  CHECK_THAT(error_of([&] { tensortap::watch(*fc, Options(refused.path)); }), Catch::Contains("an unknown key"));
  CHECK_FALSE(fs::exists(refused / "run.json"));
}

TEST_CASE("TENSORTAP=off makes every recorder inert: no directory, file, hook or thread", "[sdk][environment]") {
  TempDir root;
  const std::string dir = root / "never";
  const Env off("TENSORTAP", "OFF");
  torch::nn::Linear fc(3, 2);
  std::shared_ptr<tensortap::Recorder> rec;
  const std::string err = tt_test::stderr_of(root / "stderr", [&] {
    rec = tensortap::watch(*fc, Options(dir).stats_every(1).flight_recorder(3));  // watch() does not throw
    tensortap::Recorder other{Options(dir + "2")};
  });
  // One line says so, once a process (this one may have said it already).
  CHECK(err.find("TENSORTAP=off") == err.rfind("TENSORTAP=off"));
  for (std::int64_t s = 0; s < 3; ++s) {
    rec->step(s);
    fc->forward(torch::randn({4, 3})).sum().backward();
    rec->capture("loss", torch::ones({}));
  }
  rec->flush();
  CHECK(rec->counters().records == 0);
  CHECK(rec->counters().captured == 0);
  CHECK(rec->dumps().empty());
  CHECK(rec->run_dir() == dir);
  rec->close();
  CHECK_FALSE(fs::exists(dir));
  CHECK_FALSE(fs::exists(dir + "2"));
  // Any other value is refused, like a bad key; empty or on is the default.
  {
    const Env bad("TENSORTAP", "maybe");
    CHECK_THAT(error_of([&] { tensortap::Recorder r{Options(root / "x")}; }),
               Catch::Contains("TENSORTAP=maybe: expected off (or 0, false)"));
  }
  {
    const Env on("TENSORTAP", "on");
    tensortap::Recorder r{Options(root / "on")};
    r.close();
    CHECK(fs::exists(root / "on/run.json"));
  }
}

TEST_CASE("TENSORTAP=off: the README's loop, with record_grads, Tap, dump and ctl, prints only the one line",
          "[sdk][environment]") {
  // Issue 71: record_grads() on an inert recorder warned that the
  // optimizer's parameters were not watched, with advice that was wrong.
  TempDir root;
  const std::string dir = root / "off";
  const Env off("TENSORTAP", "off");
  torch::nn::Sequential model(torch::nn::Linear(3, 4), tensortap::Tap(), torch::nn::Linear(4, 2));
  torch::optim::SGD opt(model->parameters(), torch::optim::SGDOptions(0.1));
  const std::string err = tt_test::stderr_of(root / "stderr", [&] {
    auto rec = tensortap::watch(*model, Options(dir).every(1).stats_every(1).flight_recorder(2).max_bytes(1 << 20)
                                            .stall_after(std::chrono::milliseconds(100)));
    for (std::int64_t s = 0; s < 3; ++s) {
      rec->step(s);
      const torch::Tensor loss = model->forward(torch::randn({5, 3})).pow(2).mean();
      rec->capture("loss", loss);
      opt.zero_grad();
      loss.backward();
      rec->record_grads(opt);
      opt.step();
    }
    rec->dump();
    rec->flush();
    rec->close();
    CHECK(rec->counters().records == 0);
  });
  // At most the one documented line (this process may have said it already).
  std::string rest = err;
  const std::size_t line = rest.find("tensortap: TENSORTAP=off:");
  if (line != std::string::npos) rest.erase(line, rest.find('\n', line) + 1 - line);
  CHECK(rest.empty());
  CHECK_FALSE(fs::exists(dir));
}

TEST_CASE("TENSORTAP=off in a fork() child: the child's recorders are inert, the parent's run goes on",
          "[sdk][environment][hostile]") {
  TempDir root;
  tensortap::Recorder parent{Options(root / "parent")};
  parent.step(0);
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::setenv("TENSORTAP", "off", 1);
    int code = 0;
    try {
      tensortap::Recorder child{Options(root / "child")};
      child.step(0);
      child.capture("x", torch::ones({2}));
      child.close();
      if (std::filesystem::exists(root / "child")) code = 3;
    } catch (...) {
      code = 4;
    }
    ::_exit(code);
  }
  int status = 0;
  REQUIRE(::waitpid(pid, &status, 0) == pid);
  CHECK(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 0);
  parent.capture("y", torch::ones({2}));
  parent.close();
  CHECK(parent.counters().records == 1);
}

TEST_CASE("TENSORTAP_CUDA_STATS: arena or tensor, anything else refused by name when a recorder is made",
          "[sdk][environment]") {
  {
    const Env unset("TENSORTAP_CUDA_STATS", nullptr);
    CHECK(tensortap::detail::cuda_stats_in_arena() == tensortap::detail::kCudaStatsInArena);
  }
  {
    const Env arena("TENSORTAP_CUDA_STATS", "arena");
    CHECK(tensortap::detail::cuda_stats_in_arena());
  }
  {
    const Env tensor("TENSORTAP_CUDA_STATS", " Tensor ");
    CHECK_FALSE(tensortap::detail::cuda_stats_in_arena());
  }
  const Env bad("TENSORTAP_CUDA_STATS", "fast");
  TempDir dir;
  CHECK_THAT(error_of([&] { tensortap::Recorder rec(Options(dir / "run")); }),
             Catch::Contains("TENSORTAP_CUDA_STATS=fast: expected arena or tensor"));
  // Nothing made: the refusal comes before the run directory.
  CHECK_FALSE(std::filesystem::exists(dir / "run"));
}

namespace {

// The setters options.h declares (and format.h, for Hdf5Options and
// PackedOptions): Options' TORCH_ARGs and members returning Options&, and
// the fields of the option structs it holds as "Struct::name"; deprecated
// ones left out (CHANGELOG.md lists them). every(Kind, n) is "every(kind)".
std::set<std::string> header_setters() {
  std::set<std::string> out;
  const std::regex open(R"(^struct (?:\[\[[^\]]*\]\] )?(\w+) \{)");
  const std::regex arg(R"(^\s*TORCH_ARG\([^,]+(?:<[^>]*>)?[^,]*,\s*(\w+)\))");
  const std::regex member(R"(^\s*Options& (\w+)\(([^)]*))");
  for (const char* header : {"/sdk/include/tensortap/options.h", "/writers/include/tensortap/format.h"}) {
    std::istringstream lines(tt_test::read_file(std::string(TT_SOURCE_DIR) + header));
    std::string line, current, previous;
    for (; std::getline(lines, line); previous = line) {
      std::smatch m;
      if (std::regex_search(line, m, open)) current = m[1];
      if (line == "};") current.clear();
      const bool deprecated = previous.find("[[deprecated") != std::string::npos ||
                              line.find("[[deprecated") != std::string::npos;
      if (current.empty() || deprecated) continue;
      const bool kept = current == "Options" || current == "Hdf5Options" || current == "PackedOptions" ||
                        current == "TensorBoardOptions";
      if (!kept) continue;
      const std::string prefix = current == "Options" ? "" : current + "::";
      if (std::regex_search(line, m, arg)) out.insert(prefix + m[1].str());
      if (current == "Options" && std::regex_search(line, m, member))
        out.insert(m[1].str() == "every" && m[2].str().find("Kind") != std::string::npos ? "every(kind)" : m[1].str());
    }
  }
  return out;
}

}  // namespace

TEST_CASE("the option table has a row for every setter of options.h, and docs/options.md one for each", "[sdk][environment]") {
  const std::set<std::string> declared = header_setters();
  // The parse found the settings (a header reshaped would find none).
  REQUIRE(declared.count("dir") == 1);
  REQUIRE(declared.count("every(kind)") == 1);
  REQUIRE(declared.count("Hdf5Options::deflate") == 1);
  REQUIRE(declared.count("TensorBoardOptions::stats") == 1);
  std::set<std::string> table;
  for (const auto& row : tensortap::detail::option_table()) table.insert(row.setter);
  // A setter added to options.h without its row (or a row left behind) fails here.
  CHECK(declared == table);
  const std::string page = tt_test::read_file(std::string(TT_SOURCE_DIR) + "/docs/options.md");
  for (const auto& row : tensortap::detail::option_table()) {
    CAPTURE(row.setter, row.env_key);
    // Each setting's row names its setter, `Options::every(kind, n)` or
    // `Hdf5Options::deflate(level)`, and its key, if it has one.
    std::string setter = row.setter;
    if (setter.find("::") == std::string::npos) setter = "Options::" + setter;
    setter = setter == "Options::every(kind)" ? "`Options::every(kind," : "`" + setter + "(";
    CHECK(page.find(setter) != std::string::npos);
    if (*row.env_key != '\0' && row.from_text != nullptr)
      CHECK(page.find(std::string("`") + row.env_key + "`") != std::string::npos);
  }
}

TEST_CASE("every key of the option table is one TENSORTAP_OPTIONS takes, and says so in run.json", "[sdk][environment]") {
  // Each settable key, set from text to a value it takes, reaches its setter.
  for (const auto& row : tensortap::detail::option_table()) {
    if (*row.env_key == '\0' || row.from_text == nullptr) continue;
    std::string key = row.env_key;
    if (key == "every.<kind>") key = "every.grad";
    CAPTURE(key);
    CHECK(tensortap::detail::option_row(key) == &row);
  }
  CHECK(tensortap::detail::option_row("every.nothing") != nullptr);  // the kind is checked when set
  CHECK_THAT(error_of([] {
               Options o("x");
               apply_options_text(o, "every.nothing=3");
             }),
             Catch::Contains("'nothing' is not a kind"));
  CHECK(tensortap::detail::option_row("hdf5") == nullptr);
  CHECK(tensortap::detail::option_row("dump_onx") == nullptr);
}
