#include <cmath>
// Format::Hdf5 through the Recorder: errors and flushing. The layout and
// types are checked with h5py (check_e2e.py, test_hdf5.py).
#include <H5Cpp.h>
#include <fmt/format.h>

#include <tensortap/tensortap.h>

#include "helpers.h"

using tensortap::Format;
using tensortap::Options;
using tensortap::Recorder;
using tt_test::TempDir;

TEST_CASE("an HDF5 run refuses a name whose rank changes, naming it, and keeps the rest", "[writers][hdf5]") {
  TempDir dir;
  Recorder rec{Options(dir.path).format(Format::Hdf5)};
  rec.step(0);
  rec.capture("x", at::ones({2, 3}));
  rec.capture("y", at::ones({2}));
  rec.step(1);
  rec.capture("x", at::ones({6}));
  rec.capture("y", at::ones({5}));  // a different length is fine
  std::string err;
  try {
    rec.close();
  } catch (const tensortap::Error& e) {
    err = e.what();
  }
  REQUIRE_THAT(err, Catch::Contains("'x'") && Catch::Contains("rank 1") && Catch::Contains("/tensor/x/data") &&
                        Catch::Contains("tensors.h5"));
  REQUIRE(rec.stats().records == 3);
  REQUIRE(rec.stats().errors == 1);
  REQUIRE(tt_test::read_lines(dir / "index.jsonl").size() == 3);
  REQUIRE(tt_test::index_lines_with(dir.path, "\"name\":\"y\",\"dtype\":\"float32\",\"shape\":[5]").size() == 1);
}

TEST_CASE("HDF5 index lines wait for the flush cadence, and flush() forces it", "[writers][hdf5]") {
  TempDir dir;
  Recorder rec{Options(dir.path).format(Format::Hdf5).hdf5(tensortap::Hdf5Options().flush_every(1000))};
  for (std::int64_t s = 0; s < 5; ++s) {
    rec.step(s);
    rec.capture("x", at::full({3}, s));
  }
  // The writer may have written the rows, but not flushed them: no index line
  // may point at data a crash could lose.
  REQUIRE(tt_test::read_lines(dir / "index.jsonl").empty());
  rec.flush();
  REQUIRE(tt_test::read_lines(dir / "index.jsonl").size() == 5);
  rec.step(5);
  rec.capture("x", at::full({3}, 5));
  rec.close();
  REQUIRE(tt_test::read_lines(dir / "index.jsonl").size() == 6);
}

TEST_CASE("an HDF5 run streams tensors larger than a staging buffer", "[writers][hdf5]") {
  TempDir dir;
  Recorder rec{Options(dir.path).format(Format::Hdf5).buffer_bytes(4096)};
  rec.step(0);
  rec.capture("big", at::arange(50 * 77, at::kDouble).reshape({50, 77}));
  rec.capture("bf", at::arange(3000, at::kFloat).to(at::kBFloat16));
  rec.close();
  REQUIRE(rec.stats().records == 2);
  REQUIRE(rec.stats().errors == 0);
  H5::H5File f(dir / "tensors.h5", H5F_ACC_RDONLY);
  std::vector<double> big(50 * 77);
  f.openDataSet("/tensor/big/data").read(big.data(), H5::PredType::NATIVE_DOUBLE);
  for (size_t i = 0; i < big.size(); ++i) REQUIRE(big[i] == static_cast<double>(i));
  std::vector<float> bf(3000);
  f.openDataSet("/tensor/bf/data").read(bf.data(), H5::PredType::NATIVE_FLOAT);
  const at::Tensor want = at::arange(3000, at::kFloat).to(at::kBFloat16).to(at::kFloat);
  REQUIRE(at::equal(at::from_blob(bf.data(), {3000}), want));
}

TEST_CASE("an HDF5 run's flight recorder dumps into tensors.h5, large records included", "[writers][hdf5][flight]") {
  TempDir dir;
  Recorder rec{Options(dir.path).format(Format::Hdf5).buffer_bytes(4096).flight_recorder(2)};
  for (std::int64_t s = 0; s < 8; ++s) {
    rec.step(s);
    rec.capture("big", at::full({3000}, static_cast<double>(s)));  // chunked through staging
    rec.capture("x", at::full({2}, s == 5 ? std::nan("") : 1.0));
  }
  rec.close();
  REQUIRE(rec.stats().errors == 0);
  REQUIRE(rec.stats().records == 6);  // steps 3, 4, 5
  H5::H5File f(dir / "tensors.h5", H5F_ACC_RDONLY);
  std::vector<std::int64_t> steps(3);
  f.openDataSet("/tensor/big/steps").read(steps.data(), H5::PredType::NATIVE_INT64);
  REQUIRE(steps == std::vector<std::int64_t>{3, 4, 5});
  std::vector<double> big(3 * 3000);
  f.openDataSet("/tensor/big/data").read(big.data(), H5::PredType::NATIVE_DOUBLE);
  REQUIRE(big[0] == 3.0);
  REQUIRE(big[2 * 3000 + 2999] == 5.0);
}
