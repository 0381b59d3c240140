// Inputs at the edges of float64 for the statistics contract
// (writers/src/stats_fields.h), and how two of its paths must agree on
// them: the host scan is the reference, and each other path (ATen's
// reductions, the fused kernels' arithmetic on the host, the kernels on a
// GPU) is held to it by tests/unit/test_stats.cpp and tests/cuda/test_cuda.cpp.
#pragma once

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "sdk/src/core/stats.h"

namespace tt_test {

struct ExtremeCase {
  std::string label;
  std::vector<double> values;
};

/// Values whose squares overflow or vanish (round 4's), alone and mixed with
/// ordinary ones, zeros and non-finite values; some long enough that the
/// kernels use many blocks and each thread takes several values.
inline std::vector<ExtremeCase> extreme_cases() {
  const double inf = std::numeric_limits<double>::infinity(), nan = std::numeric_limits<double>::quiet_NaN();
  std::vector<ExtremeCase> cases{
      {"five 1e300", {1e300, 1e300, 1e300, 1e300, 1e300}},
      {"five subnormal 1e-310", {1e-310, 1e-310, 1e-310, 1e-310, 1e-310}},
      {"+-5e307", {5e307, -5e307, 5e307, -5e307}},
      {"DBL_MAX/2, -DBL_MAX/2, DBL_MAX/4", {DBL_MAX / 2, -DBL_MAX / 2, DBL_MAX / 4}},
      {"ordinary values and one 1e300", {1.0, 2.0, 3.0, 1e300}},
      {"subnormals, zeros and non-finite values", {1e-310, 0.0, -0.0, 3e-320, nan, inf, -inf, -2e-310}},
      {"zeros only", {0.0, -0.0, 0.0}},
      {"a mean past 1e154 (squared deviations overflowed)", {}},
      {"100,003 of N(0, 1e300) and a few 1e-300", {}},
      {"50,000 subnormals and one 1", {}},
  };
  std::mt19937_64 rng(63);
  std::normal_distribution<double> normal;
  for (int i = 0; i < 20000; ++i) cases[7].values.push_back(1e160 * (3 + normal(rng)));
  for (int i = 0; i < 100003; ++i) cases[8].values.push_back(i % 9973 == 0 ? 1e-300 : 1e300 * normal(rng));
  for (int i = 0; i < 50000; ++i) cases[9].values.push_back(1e-310 * normal(rng));
  cases[9].values[25000] = 1.0;
  return cases;
}

/// The host scan's statistics of `values` (float64), the reference.
inline tensortap::detail::TensorStats host_stats(const std::vector<double>& values) {
  tensortap::detail::StatsAccumulator acc(tensortap::detail::Element::F64);
  acc.add(values.data(), values.size() * sizeof(double));
  return acc.result();
}

/// `got` (a path's statistics of `values`) agrees with `want` (the host
/// scan's): extremes and counts exactly, and every real field finite where
/// the host's is; mean and std within 1e-12 of the largest magnitude (their
/// algorithms differ: two passes on the host, Welford on the device), norm
/// within 1e-12 of itself.
inline void require_agree(const tensortap::detail::TensorStats& got, const tensortap::detail::TensorStats& want) {
  const auto same = [](double a, double b) { return (std::isnan(a) && std::isnan(b)) || a == b; };
  CHECK(same(got.min, want.min));
  CHECK(same(got.max, want.max));
  CHECK(got.nan == want.nan);
  CHECK(got.posinf == want.posinf);
  CHECK(got.neginf == want.neginf);
  CHECK(got.zeros == want.zeros);
  CHECK(got.numel == want.numel);
  if (std::isnan(want.mean)) {
    CHECK(std::isnan(got.mean));
    CHECK(std::isnan(got.std));
    CHECK(std::isnan(got.norm));
    return;
  }
  REQUIRE(std::isfinite(want.norm));  // the cases' norms are within float64's range
  CHECK(std::isfinite(got.mean));
  CHECK(std::isfinite(got.std));
  CHECK(std::isfinite(got.norm));
  const double largest = std::max(std::fabs(want.min), std::fabs(want.max));
  CHECK(got.mean == Approx(want.mean).epsilon(1e-12).margin(1e-12 * largest));
  CHECK(got.std == Approx(want.std).epsilon(1e-12).margin(1e-12 * largest));
  CHECK(got.norm == Approx(want.norm).epsilon(1e-12));
}

}  // namespace tt_test
