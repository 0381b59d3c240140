// A disk budget (issue 59, DESIGN section 10): Options::max_bytes with
// Budget::StopCapture, in every format.
#include <filesystem>
#include <string>
#include <sys/stat.h>

#include <catch2/catch.hpp>
#include <torch/torch.h>

#include <tensortap/tensortap.h>

#include "tests/support/helpers.h"

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

TEST_CASE("Budget::KeepLatest is refused by name until it is built; HDF5 would refuse it anyway", "[sdk][budget]") {
  TempDir dir;
  CHECK_THAT(tt_test::error_of([&] {
               tensortap::Recorder r{Options(dir.path).max_bytes(1 << 20).on_budget(tensortap::Budget::KeepLatest)};
             }),
             Catch::Contains("Options::on_budget(Budget::KeepLatest)"));
  CHECK_THAT(tt_test::error_of([&] {
               tensortap::Recorder r{Options(dir.path)
                                         .format(tensortap::Format::Hdf5)
                                         .max_bytes(1 << 20)
                                         .on_budget(tensortap::Budget::KeepLatest)};
             }),
             Catch::Contains("with Format::Hdf5"));
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
