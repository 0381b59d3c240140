#include <cmath>
#include <cstring>
#include <limits>
#include <memory>

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <torch/nn/modules/linear.h>
#include <torch/version.h>

#include <tensortap/tensortap.h>

#include "tests/support/extreme_stats.h"
#include "tests/support/fused_reference.h"
#include "tests/support/helpers.h"
#include "sdk/src/cuda/stats_kernel.h"
#include "sdk/src/flight/ring.h"
#include "sdk/src/core/stats.h"

using tensortap::AfterDump;
using tensortap::Kind;
using tensortap::Options;
using tensortap::Recorder;
using tensortap::detail::Element;
using tensortap::detail::StatsAccumulator;
using tensortap::detail::TensorStats;
using tt_test::TempDir;

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

// What NumPy computes in float64 over the finite values (the definition the
// table follows), written the plain way.
TensorStats reference(const at::Tensor& t) {
  at::Tensor x = t.is_complex() ? t.to(at::kComplexDouble).abs() : t;
  x = x.to(at::kDouble).contiguous();
  const double* p = x.data_ptr<double>();
  TensorStats s;
  s.numel = x.numel();
  double sum = 0, sumsq = 0, lo = kInf, hi = -kInf;
  std::int64_t n = 0;
  for (std::int64_t i = 0; i < x.numel(); ++i) {
    const double v = p[i];
    if (std::isnan(v))
      ++s.nan;
    else if (std::isinf(v))
      ++(v > 0 ? s.posinf : s.neginf);
    else {
      s.zeros += v == 0;
      ++n;
      sum += v;
      sumsq += v * v;
      lo = std::min(lo, v);
      hi = std::max(hi, v);
    }
  }
  if (n == 0) {
    s.min = s.max = s.mean = s.std = s.norm = kNaN;
    return s;
  }
  s.mean = sum / n;
  double m2 = 0;
  for (std::int64_t i = 0; i < x.numel(); ++i)
    if (std::isfinite(p[i])) m2 += (p[i] - s.mean) * (p[i] - s.mean);
  s.std = std::sqrt(m2 / n);
  s.min = lo;
  s.max = hi;
  s.norm = std::sqrt(sumsq);
  return s;
}

void require_close(double a, double b) {
  if (std::isnan(b)) {
    REQUIRE(std::isnan(a));
    return;
  }
  REQUIRE(a == Approx(b).epsilon(1e-9).margin(1e-12));
}

void require_same(const TensorStats& a, const TensorStats& b) {
  require_close(a.min, b.min);
  require_close(a.max, b.max);
  require_close(a.mean, b.mean);
  require_close(a.std, b.std);
  require_close(a.norm, b.norm);
  REQUIRE(a.nan == b.nan);
  REQUIRE(a.posinf == b.posinf);
  REQUIRE(a.neginf == b.neginf);
  REQUIRE(a.zeros == b.zeros);
  REQUIRE(a.numel == b.numel);
}

// A tensor of `dtype` with zeros, and NaN and infinities where the dtype
// has them.
at::Tensor sample(at::ScalarType dtype) {
  at::Tensor t = (at::randn({257}, at::kDouble) * 50 + 3);
  t.index_put_({at::indexing::Slice(0, 5)}, 0);
  if (at::isFloatingType(dtype) || at::isComplexType(dtype)) {
    t[7] = kNaN;
    t[9] = kInf;
    t[11] = -kInf;
  }
  if (dtype == at::kBool) return t.gt(3);
  if (dtype == at::kByte) return t.abs().clamp_max(255).to(dtype);
  if (at::isComplexType(dtype)) return at::complex(t, t.flip(0).nan_to_num(0, 0, 0)).to(dtype);
  return t.nan_to_num(kNaN, kInf, -kInf).clamp(-100, 100).where(t.isfinite(), t).to(dtype);
}

// stats.npy's rows, parsed the way NumPy reads the header's dtype.
struct Row {
  std::int64_t step, series;
  double min, max, mean, std, norm;
  std::int64_t nan, posinf, neginf, zeros, numel;
};

std::vector<Row> stats_rows(const std::string& run) {
  const std::string bytes = tt_test::read_file(run + "/stats.npy");
  REQUIRE(bytes.size() >= 512);
  REQUIRE_THAT(bytes.substr(0, 512), Catch::Contains("('step', '<i8'), ('series', '<i8'), ('min', '<f8')"));
  std::vector<Row> rows((bytes.size() - 512) / sizeof(Row));
  std::memcpy(rows.data(), bytes.data() + 512, rows.size() * sizeof(Row));
  REQUIRE_THAT(bytes.substr(0, 512), Catch::Contains(fmt::format("'shape': ({},)", rows.size())));
  return rows;
}

std::vector<std::int64_t> index_steps(const std::string& run) {
  std::vector<std::int64_t> steps;
  for (const auto& line : tt_test::read_lines(run + "/index.jsonl")) {
    const auto at = line.find("\"step\":");
    steps.push_back(std::stoll(line.substr(at + 7)));
  }
  std::sort(steps.begin(), steps.end());
  steps.erase(std::unique(steps.begin(), steps.end()), steps.end());
  return steps;
}

std::vector<std::int64_t> range(std::int64_t a, std::int64_t b) {
  std::vector<std::int64_t> v;
  for (std::int64_t i = a; i <= b; ++i) v.push_back(i);
  return v;
}

}  // namespace

TEST_CASE("statistics of every dtype match a float64 reference over the finite values", "[sdk][stats]") {
  for (auto dtype : {at::kBool, at::kByte, at::kChar, at::kShort, at::kInt, at::kLong, at::kHalf, at::kFloat,
                     at::kDouble, at::kComplexFloat, at::kComplexDouble}) {
    CAPTURE(c10::toString(dtype));
    const at::Tensor t = sample(dtype);
    const TensorStats want = reference(t);
    const Element element = tensortap::detail::dtype_info(dtype)->element;
    StatsAccumulator whole(element);
    whole.add(t.data_ptr(), t.nbytes());
    require_same(whole.result(), want);
    // Chunked as a record larger than a buffer would be: same figures.
    StatsAccumulator chunked(element);
    const std::size_t unit = t.element_size();
    const char* p = static_cast<const char*>(t.data_ptr());
    for (std::size_t off = 0, n = 1; off < t.nbytes(); off += n * unit, n = n * 3 + 1)
      chunked.add(p + off, std::min(n * unit, t.nbytes() - off));
    require_same(chunked.result(), want);
    // And ATen on the tensor's own device (the path for CUDA tensors).
    const at::Tensor v = tensortap::detail::device_stats(t);
    REQUIRE(v.scalar_type() == at::kDouble);
    REQUIRE(v.numel() == tensortap::detail::kStatsVectorSize);
    require_same(tensortap::detail::stats_from_vector(v.data_ptr<double>()), want);
  }
}

// The accumulator over `values` stored as `element`, whole and in chunks of
// whole elements, against the reference of the same values in float64.
template <typename T>
void require_stats_of(Element element, const std::vector<T>& values, const std::vector<double>& as_double) {
  const TensorStats want = reference(at::tensor(at::ArrayRef<double>(as_double), at::kDouble));
  StatsAccumulator whole(element);
  whole.add(values.data(), values.size() * sizeof(T));
  require_same(whole.result(), want);
  StatsAccumulator chunked(element);
  for (std::size_t off = 0, n = 1; off < values.size(); off += n, n = n * 2 + 1)
    chunked.add(values.data() + off, std::min(n, values.size() - off) * sizeof(T));
  require_same(chunked.result(), want);
}

template <typename T>
void require_unsigned_stats(Element element) {
  const T top = static_cast<T>(T(1) << (8 * sizeof(T) - 1));
  const std::vector<T> values = {0, 1, top, static_cast<T>(~T(0)), 7, 0};
  require_stats_of(element, values, std::vector<double>(values.begin(), values.end()));
}

TEST_CASE("statistics of uint16, uint32, uint64 and float8 records are those of their values", "[sdk][stats]") {
  // Elements, not LibTorch dtypes: LibTorch 1.13 has neither, the
  // accumulator handles both wherever the records come from.
  require_unsigned_stats<std::uint16_t>(Element::U16);
  require_unsigned_stats<std::uint32_t>(Element::U32);
  require_unsigned_stats<std::uint64_t>(Element::U64);
  for (Element f : {Element::F8E4M3FN, Element::F8E5M2, Element::F8E4M3FNUZ, Element::F8E5M2FNUZ, Element::F8E8M0FNU}) {
    CAPTURE(static_cast<int>(f));
    std::vector<std::uint8_t> codes(256);
    std::vector<double> values(256);
    for (int c = 0; c < 256; ++c) {
      codes[c] = static_cast<std::uint8_t>(c);
      values[c] = tensortap::detail::float8_value(f, codes[c]);
    }
    require_stats_of(f, codes, values);
  }
}

#if TORCH_VERSION_MAJOR >= 2
TEST_CASE("statistics of LibTorch 2.x's uint and float8 tensors: host scan and device path agree", "[sdk][stats]") {
  using tensortap::detail::dtype_info;
  using tensortap::detail::scalar_type_named;
  for (const char* torch_name : {"UInt16", "UInt32", "UInt64", "Float8_e4m3fn", "Float8_e5m2", "Float8_e4m3fnuz",
                                 "Float8_e5m2fnuz", "Float8_e8m0fnu"}) {
    const auto dtype = scalar_type_named(torch_name);
    if (!dtype) continue;  // not in this LibTorch
    CAPTURE(torch_name);
    const bool unsigned_int = torch_name[0] == 'U';
    // Every byte pattern in the lowest byte, the top bit set in some.
    at::Tensor bytes = at::arange(256 * c10::elementSize(*dtype), at::kLong).remainder(256).to(at::kByte);
    if (unsigned_int) bytes = bytes.flip(0);
    const at::Tensor t = bytes.view(*dtype);
    const auto* info = dtype_info(*dtype);
    REQUIRE(info != nullptr);
    StatsAccumulator acc(info->element);
    acc.add(bytes.data_ptr(), bytes.nbytes());
    const TensorStats host = acc.result();
    const at::Tensor v = tensortap::detail::device_stats(t);
    require_same(tensortap::detail::stats_from_vector(v.data_ptr<double>()), host);
    require_same(host, reference(unsigned_int ? t.to(at::kDouble) : t.to(at::kFloat)));
  }
}
#endif

TEST_CASE("statistics of an empty or all-NaN tensor are NaN, with the counts", "[sdk][stats]") {
  for (const at::Tensor& t : {at::empty({0, 3}), at::full({4}, kNaN), at::full({2}, -kInf)}) {
    const TensorStats want = reference(t);
    StatsAccumulator acc(Element::F32);
    acc.add(t.data_ptr(), t.nbytes());
    require_same(acc.result(), want);
    require_same(tensortap::detail::stats_from_vector(tensortap::detail::device_stats(t).data_ptr<double>()), want);
  }
}

TEST_CASE("device statistics of bfloat16 match the host scan of the float32 it is stored as", "[sdk][stats]") {
  // The host scans what the writers store (bfloat16 widened to float32);
  // the device path reduces the bfloat16 tensor itself.
  const at::Tensor t = sample(at::kFloat).to(at::kBFloat16);
  const at::Tensor stored = t.to(at::kFloat);
  StatsAccumulator host(Element::F32);
  host.add(stored.data_ptr(), stored.nbytes());
  const TensorStats want = host.result();
  REQUIRE(want.nan == 1);
  REQUIRE(want.posinf == 1);
  REQUIRE(want.neginf == 1);
  require_same(tensortap::detail::stats_from_vector(tensortap::detail::device_stats(t).data_ptr<double>()), want);
  // A strided view with a storage offset reduces the same as its copy.
  const at::Tensor view = at::cat({t, t}).view({2, -1}).t().select(1, 1);
  require_same(tensortap::detail::stats_from_vector(tensortap::detail::device_stats(view).data_ptr<double>()), want);
}

TEST_CASE("a large mean does not cost std its precision", "[sdk][stats]") {
  const at::Tensor t = at::arange(1000, at::kDouble) * 1e-3 + 1e8;
  StatsAccumulator acc(Element::F64);
  acc.add(t.data_ptr(), t.nbytes());
  REQUIRE(acc.result().std == Approx(t.std(/*unbiased=*/false).item<double>()).epsilon(1e-9));
}

TEST_CASE("statistics of finite values near DBL_MAX and of subnormal ones are finite and right (round 4)",
          "[sdk][stats]") {
  // Their squares overflow or vanish: five 1e300 gave std NaN and norm inf,
  // five 1e-310 norm 0. The host scan sums such chunks scaled, and ATen's
  // path scales the tensor by a power of two.
  struct Case {
    std::vector<double> values;
    double mean, std, norm;
  };
  const double big = 1e300, tiny = 1e-310, huge = 5e307;
  const std::vector<Case> cases{
      {{big, big, big, big, big}, big, 0, std::sqrt(5.0) * big},
      {{tiny, tiny, tiny, tiny, tiny}, tiny, 0, std::sqrt(5.0) * tiny},
      {{huge, -huge, huge, -huge}, 0, huge, 2 * huge},
      {{big, -big}, 0, big, std::sqrt(2.0) * big},
  };
  for (const Case& c : cases) {
    INFO("values " << c.values[0] << ", " << c.values[1]);
    for (std::size_t chunk : {c.values.size(), std::size_t{1}}) {  // whole, and merged value by value
      INFO("chunks of " << chunk);
      StatsAccumulator acc(Element::F64);
      for (std::size_t i = 0; i < c.values.size(); i += chunk)
        acc.add(c.values.data() + i, std::min(chunk, c.values.size() - i) * sizeof(double));
      const TensorStats s = acc.result();
      CHECK(s.mean == Approx(c.mean).margin(1e-300 * c.norm));
      CHECK(s.std == Approx(c.std).margin(1e-12 * c.norm));
      CHECK(s.norm == Approx(c.norm).epsilon(1e-6));
      CHECK(std::isfinite(s.norm));
    }
    // ATen's reductions (device_stats, CUDA tensors without the fused
    // kernels) scale the same way: they gave norm inf for five 1e300.
    const at::Tensor t = at::tensor(c.values, at::kDouble);
    const TensorStats d = tensortap::detail::stats_from_vector(tensortap::detail::device_stats(t).data_ptr<double>());
    INFO("device_stats");
    CHECK(d.mean == Approx(c.mean).margin(1e-300 * c.norm));
    CHECK(d.std == Approx(c.std).margin(1e-12 * c.norm));
    CHECK(d.norm == Approx(c.norm).epsilon(1e-6));
    CHECK(std::isfinite(d.norm));
    CHECK(d.min == *std::min_element(c.values.begin(), c.values.end()));
    CHECK(d.max == *std::max_element(c.values.begin(), c.values.end()));
  }
  // A chunk of ordinary values merged with one of huge ones.
  StatsAccumulator mixed(Element::F64);
  const double ordinary[] = {1.0, 2.0, 3.0}, huge_ones[] = {1e300};
  mixed.add(ordinary, sizeof(ordinary));
  mixed.add(huge_ones, sizeof(huge_ones));
  CHECK(mixed.result().norm == Approx(1e300));
  CHECK(mixed.result().mean == Approx(0.25e300));
  CHECK(mixed.result().std == Approx(std::sqrt(3.0) / 4 * 1e300));
}

namespace {

// The fused kernels' reduction, as tests/support/fused_reference.h runs it.
TensorStats fused_on_host(const std::vector<double>& values) {
  std::vector<double> out(tensortap::detail::kStatsFields);
  tt_test::fused_stats_on_host(static_cast<std::int64_t>(values.size()),
                               [&](std::int64_t i) { return values[static_cast<std::size_t>(i)]; }, out.data());
  return tensortap::detail::stats_from_vector(out.data());
}

}  // namespace

TEST_CASE("every statistics path agrees with the host scan on extreme inputs (the statistics contract)",
          "[sdk][stats]") {
  // The host scan whole and in chunks (Chan's merge across chunk
  // exponents), ATen's reductions (device_stats on the CPU: the path of CUDA
  // tensors without the fused kernels), and the fused kernels' arithmetic.
  // Their device run is tests/cuda/test_cuda.cpp's, on a GPU.
  for (const tt_test::ExtremeCase& c : tt_test::extreme_cases()) {
    INFO(c.label);
    const TensorStats want = tt_test::host_stats(c.values);
    {
      INFO("the host scan in chunks of 1,000");
      StatsAccumulator acc(Element::F64);
      for (std::size_t i = 0; i < c.values.size(); i += 1000)
        acc.add(c.values.data() + i, std::min<std::size_t>(1000, c.values.size() - i) * sizeof(double));
      tt_test::require_agree(acc.result(), want);
    }
    {
      INFO("ATen's reductions");
      const at::Tensor t = at::tensor(c.values, at::kDouble);
      tt_test::require_agree(
          tensortap::detail::stats_from_vector(tensortap::detail::device_stats(t).data_ptr<double>()), want);
    }
    {
      INFO("the fused kernels' arithmetic");
      tt_test::require_agree(fused_on_host(c.values), want);
    }
  }
}

TEST_CASE("stats_every writes one row per tensor and step, independent of every()", "[sdk][stats]") {
  TempDir dir;
  Recorder rec{Options(dir.path).every(5).stats_every(2)};
  for (std::int64_t s = 0; s < 10; ++s) {
    rec.step(s);
    rec.capture("a", at::full({3}, static_cast<double>(s)));
    rec.capture("b", at::arange(4, at::kFloat));
  }
  rec.close();
  const auto rows = stats_rows(dir.path);
  REQUIRE(rows.size() == 10);  // steps 0, 2, 4, 6, 8 x 2 names
  for (const Row& r : rows) {
    REQUIRE(r.step % 2 == 0);
    REQUIRE(r.numel == (r.series == 0 ? 3 : 4));
    if (r.series == 0) REQUIRE(r.mean == r.step);
  }
  const auto legend = tt_test::read_lines(dir / "stats_series.jsonl");
  REQUIRE(legend == std::vector<std::string>{"{\"series\":0,\"kind\":\"tensor\",\"name\":\"a\"}",
                                             "{\"series\":1,\"kind\":\"tensor\",\"name\":\"b\"}"});
  // Full tensors only where every() says: steps 0 and 5.
  REQUIRE(index_steps(dir.path) == std::vector<std::int64_t>{0, 5});
  REQUIRE(rec.counters().stats_rows == 10);
}

TEST_CASE("statistics-only capture writes no tensors, and parameter gradients get rows", "[sdk][stats][hooks]") {
  TempDir dir;
  torch::nn::Linear lin(4, 3);
  auto rec = tensortap::watch(*lin, Options(dir.path).stats_every(1).every(0));
  for (std::int64_t s = 0; s < 3; ++s) {
    rec->step(s);
    lin->forward(at::randn({8, 4})).sum().backward();
    lin->zero_grad();
  }
  rec->close();
  REQUIRE_FALSE(std::filesystem::exists(dir / "npy"));
  const auto rows = stats_rows(dir.path);
  REQUIRE(rows.size() == 6);  // weight and bias, steps 0..2
  REQUIRE(tt_test::read_file(dir / "stats_series.jsonl").find("\"kind\":\"grad\",\"name\":\"weight\"") !=
          std::string::npos);
}

TEST_CASE("a NaN at a known step dumps exactly the k steps before it and that step", "[sdk][stats][flight]") {
  TempDir dir;
  Recorder rec{Options(dir.path).flight_recorder(5)};
  for (std::int64_t s = 0; s < 60; ++s) {
    rec.step(s);
    rec.capture("w", at::full({16}, static_cast<float>(s)));
    at::Tensor loss = at::full({1}, 1.0f);
    if (s == 50) loss[0] = kNaN;
    rec.capture("loss", loss);
  }
  rec.close();
  REQUIRE(index_steps(dir.path) == range(45, 50));
  REQUIRE(tt_test::index_lines_with(dir.path, "\"name\":\"w\"").size() == 6);
  const std::string run_json = tt_test::read_file(dir / "run.json");
  REQUIRE_THAT(run_json,
               Catch::Contains("{\"step\": 50, \"reason\": \"nan\", \"steps\": [45,46,47,48,49,50], "
                               "\"kind\": \"tensor\", \"name\": \"loss\", \"trigger\": {\"kind\": \"non_finite\"}}"));
  // The file holds the value captured at its step.
  REQUIRE(at::equal(tensortap::load_npy(dir / "npy/tensor/w/00000047.npy"), at::full({16}, 47.0f)));
  REQUIRE(rec.counters().dumps == 1);
}

TEST_CASE("an Inf in a record captured later in the trigger step is written too", "[sdk][stats][flight]") {
  TempDir dir;
  Recorder rec{Options(dir.path).flight_recorder(2).every(2)};
  for (std::int64_t s = 0; s < 12; ++s) {
    rec.step(s);
    rec.capture("x", at::full({2}, s == 8 ? kInf : 1.0));
    rec.capture("after", at::ones({2}));  // still step 8: inside the dump
  }
  rec.close();
  // Sampled steps are the even ones: the two before 8, and 8.
  REQUIRE(index_steps(dir.path) == std::vector<std::int64_t>{4, 6, 8});
  REQUIRE(tt_test::index_lines_with(dir.path, "\"step\":8,").size() == 2);
  REQUIRE_THAT(tt_test::read_file(dir / "run.json"), Catch::Contains("\"reason\": \"inf\""));
}

TEST_CASE("Recorder::dump() writes the held steps and the current one", "[sdk][stats][flight]") {
  TempDir dir;
  Recorder rec{Options(dir.path).flight_recorder(3).after_dump(AfterDump::Continue)};
  for (std::int64_t s = 0; s < 30; ++s) {
    rec.step(s);
    rec.capture("x", at::full({2}, static_cast<double>(s)));
    if (s == 10 || s == 25) rec.dump();
  }
  rec.flush();
  REQUIRE(rec.counters().dumps == 2);
  rec.close();
  auto want = range(7, 10);
  for (auto s : range(22, 25)) want.push_back(s);
  REQUIRE(index_steps(dir.path) == want);
  REQUIRE_THAT(tt_test::read_file(dir / "run.json"),
               Catch::Contains("{\"step\": 25, \"reason\": \"user\", \"steps\": [22,23,24,25]}"));
}

TEST_CASE("after a dump, StopCapture stops full tensors and statistics go on", "[sdk][stats][flight]") {
  TempDir dir;
  Recorder rec{Options(dir.path).flight_recorder(1).stats_every(1)};
  for (std::int64_t s = 0; s < 10; ++s) {
    rec.step(s);
    rec.capture("x", at::full({2}, s >= 4 ? kNaN : 0.0));
    rec.flush();  // the writer sees step s before step s+1 begins
  }
  rec.close();
  REQUIRE(index_steps(dir.path) == std::vector<std::int64_t>{3, 4});
  REQUIRE(stats_rows(dir.path).size() == 10);
  REQUIRE(rec.counters().dumps == 1);
}

TEST_CASE("after a dump, Throw makes the next step() throw, naming the step and the reason", "[sdk][stats][flight]") {
  TempDir dir;
  Recorder rec{Options(dir.path).flight_recorder(2).after_dump(AfterDump::Throw)};
  rec.step(0);
  rec.capture("x", at::ones({2}));
  rec.step(1);
  rec.capture("grad_norm", at::full({1}, kNaN));
  rec.flush();
  std::string what;
  try {
    rec.step(2);
  } catch (const tensortap::Error& e) {
    what = e.what();
  }
  REQUIRE_THAT(what, Catch::Contains("dumped steps 0, 1 after a nan at step 1 in tensor 'grad_norm'"));
  rec.step(3);  // once: training may go on, without full capture
  rec.close();
  REQUIRE(index_steps(dir.path) == std::vector<std::int64_t>{0, 1});
}

TEST_CASE("the flight recorder's byte budget lets the oldest steps go first", "[sdk][stats][flight]") {
  TempDir dir;
  // 4 KiB a step, a budget of 10 KiB: two steps fit, and the current one is
  // never let go for its own records.
  Recorder rec{Options(dir.path).flight_recorder(8).flight_recorder_bytes(10 << 10)};
  for (std::int64_t s = 0; s < 10; ++s) {
    rec.step(s);
    rec.capture("x", at::zeros({1024}));
  }
  rec.capture("big", at::zeros({4096}));  // 16 KiB: cannot be held at all
  rec.dump();
  rec.close();
  REQUIRE(index_steps(dir.path) == std::vector<std::int64_t>{8, 9});
  REQUIRE(rec.counters().dropped == 1);
}

TEST_CASE("the flight ring keeps k steps before the newest and places late records", "[sdk][stats][flight]") {
  tensortap::detail::FlightRing ring(2, 1 << 20);
  const auto rec = [](std::int64_t step) {
    tensortap::detail::Record m;
    m.desc.step = step;
    return tensortap::detail::HeldRecord{m, std::string(8, 'x')};
  };
  for (std::int64_t s : {0, 1, 2, 3}) REQUIRE(ring.hold(rec(s)));
  REQUIRE(ring.steps() == std::vector<std::int64_t>{1, 2, 3});
  REQUIRE(ring.hold(rec(2)));         // late, still held
  REQUIRE_FALSE(ring.hold(rec(0)));   // late, outside the window
  REQUIRE(ring.take(3).size() == 4);  // 1, 2, 2, 3
  REQUIRE(ring.steps().empty());
  for (std::int64_t s : {10, 11, 12}) REQUIRE(ring.hold(rec(s)));
  REQUIRE(ring.take(20).size() == 2);  // the 2 newest before 20
}

TEST_CASE("flight_recorder(INT64_MAX) keeps every step the budget allows (round 4)", "[sdk][stats][flight]") {
  // k + 1 overflowed: the ring kept only the newest step.
  tensortap::detail::FlightRing ring(std::numeric_limits<std::int64_t>::max(), 1 << 20);
  for (std::int64_t s = 0; s < 5; ++s) {
    tensortap::detail::Record m;
    m.desc.step = s;
    REQUIRE(ring.hold(tensortap::detail::HeldRecord{m, std::string(8, 'x')}));
  }
  REQUIRE(ring.steps() == std::vector<std::int64_t>{0, 1, 2, 3, 4});
  REQUIRE(ring.take(4).size() == 5);
}

TEST_CASE("flight recorder and statistics options are checked", "[sdk][stats]") {
  TempDir dir;
  REQUIRE_THROWS_WITH(Recorder(Options(dir.path).stats_every(-1)), Catch::Contains("Options::stats_every(-1)"));
  REQUIRE_THROWS_WITH(Recorder(Options(dir.path).flight_recorder(-2)), Catch::Contains("Options::flight_recorder(-2)"));
  Recorder rec{Options(dir.path)};
  rec.step(0);
  REQUIRE_THROWS_WITH(rec.dump(), Catch::Contains("set Options::flight_recorder(k)"));
}
