#include "sdk/src/core/stats.h"

#include <array>
#include <cmath>
#include <complex>
#include <limits>

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>
#include <c10/util/Half.h>
#include <fmt/format.h>

#include <tensortap/error.h>
#include "writers/src/check.h"

namespace tensortap::detail {
namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

// The value a statistic sees of one element.
template <typename T>
double value_of(T v) {
  return static_cast<double>(v);
}
template <>
double value_of(c10::Half v) {
  return static_cast<double>(static_cast<float>(v));
}
template <>
double value_of(std::complex<float> v) {
  return std::abs(std::complex<double>(v.real(), v.imag()));
}
template <>
double value_of(std::complex<double> v) {
  return std::abs(v);
}

// scan()'s sums for a chunk of extreme magnitudes (unscaled, five finite
// float64 values of 1e300 gave std NaN and norm inf, five of 1e-310 norm 0):
// every value scaled by 2^-e, e the exponent of the largest, so the sums
// hold 1 at most per element; m2 and sumsq stay in those units (Part::exp).
// std::ldexp(x, k) scales x itself, exactly, for any k (2^k alone may be no
// double).
template <typename T, typename Value>
void scan_scaled(const T* p, std::size_t n, Value value, double largest, StatsAccumulator::Part& r) {
  int e = 0;
  std::frexp(largest, &e);
  double sum = 0, sumsq = 0;
  for (std::size_t i = 0; i < n; ++i) {
    const double v = value(p[i]);
    if (!std::isfinite(v)) continue;
    const double s = std::ldexp(v, -e);
    sum += s;
    sumsq += s * s;
  }
  const double mean = sum / static_cast<double>(r.finite);
  double m2 = 0;
  for (std::size_t i = 0; i < n; ++i) {
    const double v = value(p[i]);
    if (std::isfinite(v)) m2 += (std::ldexp(v, -e) - mean) * (std::ldexp(v, -e) - mean);
  }
  r.exp = e;
  r.mean = std::ldexp(mean, e);
  r.sumsq = sumsq;
  r.m2 = m2;
}

// Two passes over a chunk that is in cache: counts, extremes and the mean,
// then the squared deviations from that mean (a one-pass sum of squares
// loses std to cancellation when the mean is large).
template <typename T, typename Value>
StatsAccumulator::Part scan(const T* p, std::size_t n, Value value) {
  StatsAccumulator::Part r;
  r.numel = static_cast<std::int64_t>(n);
  double sum = 0, sumsq = 0;
  double lo = std::numeric_limits<double>::infinity(), hi = -lo;
  for (std::size_t i = 0; i < n; ++i) {
    const double v = value(p[i]);
    if (std::isnan(v)) {
      ++r.nan;
      continue;
    }
    if (std::isinf(v)) {
      ++(v > 0 ? r.posinf : r.neginf);
      continue;
    }
    r.zeros += v == 0;
    ++r.finite;
    sum += v;
    sumsq += v * v;
    lo = v < lo ? v : lo;
    hi = v > hi ? v : hi;
  }
  if (r.finite == 0) return r;
  r.min = lo;
  r.max = hi;
  const double largest = std::max(std::fabs(lo), std::fabs(hi));
  // A chunk whose largest magnitude lies outside the safe range is summed
  // again, scaled.
  if (largest > kStatsSafeHigh || (largest < kStatsSafeLow && largest > 0)) {
    scan_scaled(p, n, value, largest, r);
    return r;
  }
  r.sumsq = sumsq;
  r.mean = sum / static_cast<double>(r.finite);
  double m2 = 0;
  for (std::size_t i = 0; i < n; ++i) {
    const double v = value(p[i]);
    if (std::isfinite(v)) m2 += (v - r.mean) * (v - r.mean);
  }
  r.m2 = m2;
  return r;
}

// The value of each code of a float8 format, decoded once.
const float* float8_table(Element format) {
  static const auto tables = [] {
    constexpr Element kFormats[] = {Element::F8E4M3FN, Element::F8E5M2, Element::F8E4M3FNUZ, Element::F8E5M2FNUZ,
                                    Element::F8E8M0FNU};
    std::array<std::array<float, 256>, std::size(kFormats)> t{};
    for (std::size_t f = 0; f < std::size(kFormats); ++f)
      for (int c = 0; c < 256; ++c) t[f][c] = float8_value(kFormats[f], static_cast<std::uint8_t>(c));
    return t;
  }();
  return tables[static_cast<std::size_t>(format) - static_cast<std::size_t>(Element::F8E4M3FN)].data();
}

// Calls `visit(p, n, value)` with the stored elements of `data` as their C++
// type (`p`, `n` of them) and `value`, which gives the double a statistic
// sees of one: the one dtype switch, shared by statistics and histograms.
template <typename Visit>
auto with_elements(Element stored, const void* data, std::size_t nbytes, Visit visit) {
  const auto as = [&](auto tag) {
    using T = decltype(tag);
    return visit(static_cast<const T*>(data), nbytes / sizeof(T), [](T v) { return value_of(v); });
  };
  switch (stored) {
    case Element::Bool:
    case Element::U8: return as(std::uint8_t{});
    case Element::I8: return as(std::int8_t{});
    case Element::I16: return as(std::int16_t{});
    case Element::I32: return as(std::int32_t{});
    case Element::I64: return as(std::int64_t{});
    case Element::U16: return as(std::uint16_t{});
    case Element::U32: return as(std::uint32_t{});
    case Element::U64: return as(std::uint64_t{});
    case Element::F16: return as(c10::Half{});
    case Element::F32: return as(float{});
    case Element::F64: return as(double{});
    case Element::C64: return as(std::complex<float>{});
    case Element::C128: return as(std::complex<double>{});
    case Element::F8E4M3FN:
    case Element::F8E5M2:
    case Element::F8E4M3FNUZ:
    case Element::F8E5M2FNUZ:
    case Element::F8E8M0FNU: break;
  }
  const float* table = float8_table(stored);
  return visit(static_cast<const std::uint8_t*>(data), nbytes, [table](std::uint8_t code) { return double{table[code]}; });
}

}  // namespace

void values_of(Element stored, const void* data, std::size_t nbytes, double* out) {
  with_elements(stored, data, nbytes, [out](const auto* p, std::size_t n, auto value) {
    for (std::size_t i = 0; i < n; ++i) out[i] = value(p[i]);
    return 0;
  });
}

void StatsAccumulator::add(const void* data, std::size_t nbytes) {
  const Part c = with_elements(stored_, data, nbytes,
                               [](const auto* p, std::size_t n, auto value) { return scan(p, n, value); });
  Part& t = total_;
  if (c.finite > 0) {
    if (t.finite == 0) {
      t.min = c.min;
      t.max = c.max;
    } else {
      t.min = std::min(t.min, c.min);
      t.max = std::max(t.max, c.max);
    }
    // Chan et al.: merge two (count, mean, M2) summaries exactly, in the
    // units of the larger exponent (Part::exp).
    const int e = t.finite == 0 ? c.exp : std::max(t.exp, c.exp);
    const double na = static_cast<double>(t.finite), nb = static_cast<double>(c.finite);
    const double n = na + nb;
    const double delta = std::ldexp(c.mean, -e) - std::ldexp(t.mean, -e);
    t.m2 = std::ldexp(t.m2, 2 * (t.exp - e)) + (std::ldexp(c.m2, 2 * (c.exp - e)) + delta * delta * na * nb / n);
    t.sumsq = std::ldexp(t.sumsq, 2 * (t.exp - e)) + std::ldexp(c.sumsq, 2 * (c.exp - e));
    t.mean = std::ldexp(std::ldexp(t.mean, -e) + delta * nb / n, e);
    t.exp = e;
    t.finite += c.finite;
  }
  t.nan += c.nan;
  t.posinf += c.posinf;
  t.neginf += c.neginf;
  t.zeros += c.zeros;
  t.numel += c.numel;
}

TensorStats StatsAccumulator::result() const {
  const Part& t = total_;
  const bool any = t.finite > 0;
  const double v_min = any ? t.min : kNaN;
  const double v_max = any ? t.max : kNaN;
  const double v_mean = any ? t.mean : kNaN;
  const double v_std = any ? std::ldexp(std::sqrt(t.m2 / static_cast<double>(t.finite)), t.exp) : kNaN;
  const double v_norm = any ? std::ldexp(std::sqrt(t.sumsq), t.exp) : kNaN;
  const std::int64_t v_nan = t.nan, v_posinf = t.posinf, v_neginf = t.neginf, v_zeros = t.zeros, v_numel = t.numel;
  // Through the schema's list (stats_fields.h): a field this path does not
  // compute does not compile.
  TensorStats s;
#define TENSORTAP_FIELD_(name) s.name = v_##name;
  TENSORTAP_STATS_FIELDS(TENSORTAP_FIELD_, TENSORTAP_FIELD_)
#undef TENSORTAP_FIELD_
  return s;
}

namespace {

// The statistics vector from the pieces device_stats reduced: `xd` holds
// the finite values in float64 with every other value at the mean (so they
// move neither min, max nor the deviations); `counts` is [finite, nan,
// posinf, nonzero].
// The power of two `xd` was scaled by (scale_down), as two factors: the
// values' own statistics are the scaled ones times up[0] times up[1].
using ScaleUp = std::array<at::Tensor, 2>;

// Scales `xd` (float64, every value finite, ours to overwrite) in place by
// a power of two when its largest magnitude is beyond kStatsSafeHigh or
// kStatsSafeLow (stats_fields.h), where squares
// overflow or vanish (five 1e300: norm inf, std NaN; five 1e-310: norm 0),
// as the host scan does. Without a host sync: the exponent is a tensor, and
// a tensor within range is multiplied by 1, which changes no bit. Two
// factors, since 2^1074 (a subnormal's) is past a double's range.
ScaleUp scale_down(at::Tensor& xd) {
  const auto minmax = at::aminmax(xd);
  const at::Tensor amax = at::maximum(std::get<0>(minmax).abs(), std::get<1>(minmax).abs());
  const at::Tensor zero = at::zeros({}, xd.options());
  const at::Tensor out_of_range = (amax > kStatsSafeHigh) | ((amax > 0) & (amax < kStatsSafeLow));
  const at::Tensor e = at::where(out_of_range, at::floor(at::log2(amax)), zero);
  const at::Tensor half = at::floor(e / 2);
  xd.mul_(at::exp2(-half)).mul_(at::exp2(half - e));
  return {at::exp2(half), at::exp2(e - half)};
}

at::Tensor stats_vector(const at::Tensor& xd, const at::Tensor& mean, const at::Tensor& counts, double numel,
                        const ScaleUp& up) {
  const auto scale = [&](const at::Tensor& v) { return v * up[0] * up[1]; };
  const auto minmax = at::aminmax(xd);
  const at::Tensor v_min = scale(std::get<0>(minmax));
  const at::Tensor v_max = scale(std::get<1>(minmax));
  const std::vector<at::Tensor> c = counts.to(at::kDouble).unbind();
  const at::Tensor &finite = c[0], &v_nan = c[1], &v_posinf = c[2];
  // Welford in double over every element: the deviations of those at the
  // mean are zero, so this is the finite values' sum of squared deviations.
  const at::Tensor m2 = at::var(xd, /*unbiased=*/false) * numel;
  const at::Tensor v_mean = scale(mean);
  const at::Tensor v_std = scale((m2 / finite).sqrt());
  // sum(v^2) = M2 + n mean^2: two non-negative terms, no cancellation.
  const at::Tensor v_norm = scale((m2 + finite * mean * mean).sqrt());
  const at::Tensor v_neginf = numel - finite - v_nan - v_posinf;
  const at::Tensor v_zeros = numel - c[3];
  const at::Tensor v_numel = at::full({}, numel, xd.options());
#define TENSORTAP_FIELD_(name) v_##name,
  return at::stack({TENSORTAP_STATS_FIELDS(TENSORTAP_FIELD_, TENSORTAP_FIELD_)});
#undef TENSORTAP_FIELD_
}

}  // namespace

at::Tensor device_stats(const at::Tensor& t) {
  c10::NoGradGuard no_grad;
  const auto dbl = at::TensorOptions().dtype(at::kDouble).device(t.device());
  const auto numel = static_cast<double>(t.numel());
  if (t.numel() == 0) {
    // Reductions of nothing have no identity for min/max; build the answer
    // on the device directly rather than copying one from the host.
    at::Tensor v = at::full({kStatsVectorSize}, kNaN, dbl);
    v.narrow(0, kStatsRealFields, kStatsFields - kStatsRealFields).zero_();
    return v;
  }
  // Sums in double, as the host scan's. ATen's reductions convert a float
  // tensor to double whole for that anyway (sum(dtype=kDouble) does), so
  // there is one float64 copy, made once and reused in place; classes and
  // zeros are counted on the tensor as it is.
  at::Tensor x = t.detach();
  bool owned = false;  // whether `x` is a temporary of ours, free to overwrite
  const DtypeInfo* info = dtype_info(x.scalar_type());
  // ATen has no isfinite or isnan for float8; float32 holds each value exactly.
  if (info != nullptr && is_float8(info->element)) x = x.to(at::kFloat);
  // Magnitudes in double, as the host path computes them.
  if (x.is_complex()) {
    x = x.to(at::kComplexDouble).abs();
    owned = true;
  }
  if (!at::isFloatingType(x.scalar_type())) {
    // Integers and bool: every value is finite.
    const at::Tensor xd = x.to(at::kDouble);
    const at::Tensor none = at::zeros({}, dbl.dtype(at::kLong));
    const at::Tensor counts =
        at::stack({at::full({}, t.numel(), dbl.dtype(at::kLong)), none, none, at::count_nonzero(xd)});
    const at::Tensor one = at::ones({}, dbl);
    return stats_vector(xd, xd.sum() / numel, counts, numel, {one, one});
  }
  const at::Tensor finite = at::isfinite(x);
  // count_nonzero, not sum: a sum of a mask converts it to int64 first.
  const at::Tensor counts = at::stack({at::count_nonzero(finite), at::count_nonzero(at::isnan(x)),
                                       at::count_nonzero(at::isposinf(x)), at::count_nonzero(x)});
  at::Tensor xd = owned && x.scalar_type() == at::kDouble ? x : x.to(at::kDouble, false, /*copy=*/true);
  at::where_out(xd, finite, xd, at::zeros({}, dbl));
  const ScaleUp up = scale_down(xd);
  const at::Tensor mean = xd.sum() / counts[0];  // 0/0 when nothing is finite: NaN, and so is all it feeds
  at::where_out(xd, finite, xd, mean);
  return stats_vector(xd, mean, counts, numel, up);
}

TensorStats stats_from_vector(const double* v) {
  TensorStats s;
  int i = 0;
#define TENSORTAP_REAL_(name) s.name = v[i++];
#define TENSORTAP_COUNT_(name) s.name = static_cast<std::int64_t>(v[i++]);
  TENSORTAP_STATS_FIELDS(TENSORTAP_REAL_, TENSORTAP_COUNT_)
#undef TENSORTAP_REAL_
#undef TENSORTAP_COUNT_
  return s;
}

}  // namespace tensortap::detail
