#include <cmath>
// Format::Hdf5 through the Recorder: errors and flushing. The layout and
// types are checked with h5py (check_e2e.py, test_hdf5.py).
#include <H5Cpp.h>
#include <fmt/format.h>

#include <tensortap/tensortap.h>

#include "tests/support/helpers.h"
#include "writers/src/hdf5/layout.h"
#include "writers/src/hdf5/writer.h"
#include "writers/src/paths.h"

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
  REQUIRE(rec.counters().records == 3);
  REQUIRE(rec.counters().errors == 1);
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
  REQUIRE(rec.counters().records == 2);
  REQUIRE(rec.counters().errors == 0);
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
  REQUIRE(rec.counters().errors == 0);
  REQUIRE(rec.counters().records == 6);  // steps 3, 4, 5
  H5::H5File f(dir / "tensors.h5", H5F_ACC_RDONLY);
  std::vector<std::int64_t> steps(3);
  f.openDataSet("/tensor/big/steps").read(steps.data(), H5::PredType::NATIVE_INT64);
  REQUIRE(steps == std::vector<std::int64_t>{3, 4, 5});
  std::vector<double> big(3 * 3000);
  f.openDataSet("/tensor/big/data").read(big.data(), H5::PredType::NATIVE_DOUBLE);
  REQUIRE(big[0] == 3.0);
  REQUIRE(big[2 * 3000 + 2999] == 5.0);
}

namespace {

tensortap::detail::RecordDesc float_record(const std::string& name, std::vector<std::int64_t> shape) {
  tensortap::detail::RecordDesc d;
  d.name = name;
  d.shape.assign(shape.begin(), shape.end());
  d.nbytes = 4;
  for (std::int64_t n : d.shape) d.nbytes *= static_cast<std::uint64_t>(n);
  return d;
}

}  // namespace

TEST_CASE("HDF5 chunks, chunk cache and flush cadence are sized from the record", "[writers][hdf5]") {
  using tensortap::detail::auto_flush_steps;
  using tensortap::detail::chunk_cache_bytes;
  using tensortap::detail::data_chunk;
  using V = std::vector<hsize_t>;
  const tensortap::Hdf5Options automatic;
  const auto f32 = tensortap::detail::Element::F32;
  // Small rows share a chunk of about 64 KiB, filled in the cache.
  REQUIRE(data_chunk(float_record("k1", {256}), automatic) == V{64, 256});
  REQUIRE(data_chunk(float_record("s", {}), automatic) == V{256});
  REQUIRE(chunk_cache_bytes(V{64, 256}, f32) == std::size_t{64} << 10);
  // From 64 KiB a row has a chunk of its own, written past the cache...
  REQUIRE(data_chunk(float_record("k64", {16384}), automatic) == V{1, 16384});
  REQUIRE(data_chunk(float_record("m1", {512, 512}), automatic) == V{1, 512, 512});
  REQUIRE(chunk_cache_bytes(V{1, 512, 512}, f32) == 0);
  // ... split into chunks of about 1 MiB above that.
  REQUIRE(data_chunk(float_record("m16", {2048, 2048}), automatic) == V{1, 512, 512});
  // A fixed chunk_bytes is kept, as before.
  REQUIRE(data_chunk(float_record("k1", {256}), tensortap::Hdf5Options().chunk_bytes(1 << 20)) == V{256, 256});
  // Flushes wait for about 64 KiB of rows, 8 steps at most.
  REQUIRE(auto_flush_steps(1024) == 8);
  REQUIRE(auto_flush_steps(16 << 10) == 4);
  REQUIRE(auto_flush_steps(64 << 10) == 1);
  REQUIRE(auto_flush_steps(16 << 20) == 1);
  REQUIRE(auto_flush_steps(0) == 1);
}

TEST_CASE("HDF5 default cadence indexes large rows every step and small ones within 8", "[writers][hdf5]") {
  TempDir dir;
  const auto run = tensortap::detail::Dir::open(dir.path, false);
  tensortap::detail::Hdf5Writer writer(run, tensortap::Hdf5Options());
  std::vector<float> data(16384, 1.0f);
  auto write = [&](tensortap::detail::RecordDesc& d, std::int64_t step) {
    d.step = step;
    auto sink = writer.begin(d);
    sink->append(data.data(), d.nbytes);
    (void)sink->finish();
  };
  auto large = float_record("large", {16384});
  auto small = float_record("small", {256});
  writer.prepare({&large, &small});
  write(large, 0);
  REQUIRE(writer.sync(/*force=*/false));  // 64 KiB: durable at once
  // Small rows are flushed by the eighth step at the latest (sooner only if
  // a second passed since the first: no assertion on the steps before).
  bool durable = false;
  for (std::int64_t s = 1; s <= 8; ++s) {
    write(small, s);
    durable = writer.sync(/*force=*/false);
  }
  REQUIRE(durable);
  writer.close();
}

TEST_CASE("an HDF5 run with names new at every step reads every row back, and leaves no journal", "[writers][hdf5]") {
  TempDir dir;
  {
    Recorder rec{Options(dir.path).format(Format::Hdf5)};
    for (std::int64_t s = 0; s < 30; ++s) {
      rec.step(s);
      rec.capture("old", at::full({3}, static_cast<double>(s)));
      for (int k = 0; k < 20; ++k) rec.capture(fmt::format("new{}.{}", s, k), at::full({2}, static_cast<double>(k)));
    }
    rec.close();
    REQUIRE(rec.counters().errors == 0);
    REQUIRE(rec.counters().records == 30 * 21);
  }
  REQUIRE_FALSE(std::filesystem::exists(dir / ".tensors.h5.journal"));
  H5::H5File f(dir / "tensors.h5", H5F_ACC_RDONLY);
  for (std::int64_t s = 0; s < 30; s += 7) {
    float v[2] = {-1, -1};
    f.openDataSet(fmt::format("/tensor/new{}.19/data", s)).read(v, H5::PredType::NATIVE_FLOAT);
    REQUIRE((v[0] == 19 && v[1] == 19));
  }
  std::vector<float> old(30 * 3);
  f.openDataSet("/tensor/old/data").read(old.data(), H5::PredType::NATIVE_FLOAT);
  for (std::size_t i = 0; i < old.size(); ++i) REQUIRE(old[i] == static_cast<float>(i / 3));
}
