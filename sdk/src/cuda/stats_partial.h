// The fused statistics kernels' arithmetic (stats_kernel.cu): a partial
// result, adding a value to it, merging two, and the ten fields of the
// whole. nvcc compiles it for the device; the host compiler compiles it for
// tests/unit/test_stats.cpp, which runs it the way the kernels do (same
// blocks, threads and merge tree) against the host scan on extreme inputs:
// what the kernels compute is checked on every machine, only running them
// needs a GPU.
//
// No CUDA or LibTorch header: C's math functions, which CUDA also provides
// on the device under the same names.
#pragma once

#include <math.h>

#include <cstdint>

#include "writers/src/stats_fields.h"

#if defined(__CUDACC__)
#define TENSORTAP_HOST_DEVICE __host__ __device__
#else
#define TENSORTAP_HOST_DEVICE
#endif

namespace tensortap::detail::fused {

/// Threads a block; blocks at most; values a thread takes before another
/// block is worth launching.
constexpr int kThreads = 256;
constexpr int kMaxPartials = 1024;
constexpr std::int64_t kPerThread = 16;

/// The exponent of a partial that has seen no finite value but zeros: any
/// other exponent is larger, and a zero scaled by any power is zero.
constexpr int kNoExponent = -100000;

/// Count, mean and M2 (Welford) of the finite values, their min and max, the
/// NaN, +Inf and zero counts; all float64, so that the scratch is plain
/// doubles (kStatsPartialDoubles). As the host scan's chunks (stats.h's
/// Part::exp), values beyond kStatsSafeHigh or kStatsSafeLow are summed
/// scaled by 2^-exp, `exp` the exponent of the largest magnitude seen (0 for
/// any within them): `mean` is in units of 2^exp, `m2` of 2^(2 exp).
struct Partial {
  double n, mean, m2, min, max, nan, posinf, zeros, exp;
};

TENSORTAP_HOST_DEVICE inline Partial empty_partial() {
  Partial p;
  p.n = p.mean = p.m2 = p.min = p.max = p.nan = p.posinf = p.zeros = 0;
  p.exp = kNoExponent;
  return p;
}

// Without isfinite/isnan: their names differ between the host's <cmath>
// and CUDA's device functions, and these are exact in IEEE arithmetic (no
// fast-math anywhere in this build).
TENSORTAP_HOST_DEVICE inline bool finite(double v) { return v - v == 0; }
TENSORTAP_HOST_DEVICE inline bool not_a_number(double v) { return v != v; }

/// The exponent a magnitude `a` (finite, > 0) asks to be summed at: 0
/// within the safe range, its own beyond it. It grows with `a`, so the
/// largest of a set's is the largest magnitude's.
TENSORTAP_HOST_DEVICE inline int scale_exponent(double a) {
  if (a <= kStatsSafeHigh && a >= kStatsSafeLow) return 0;
  int e = 0;
  frexp(a, &e);
  return e;
}

/// `p` in the units of a larger exponent `e` (exact: powers of two, the
/// values shrinking towards zero at most).
TENSORTAP_HOST_DEVICE inline void rescale(Partial& p, int e) {
  const int by = static_cast<int>(p.exp) - e;
  p.mean = ldexp(p.mean, by);
  p.m2 = ldexp(p.m2, 2 * by);
  p.exp = e;
}

TENSORTAP_HOST_DEVICE inline void add(Partial& p, double v) {
  if (finite(v)) {
    if (v != 0) {
      const int e = scale_exponent(fabs(v));
      if (e > p.exp) rescale(p, e);
    }
    const double s = p.exp == 0 ? v : ldexp(v, -static_cast<int>(p.exp));
    p.n += 1;
    const double d = s - p.mean;
    p.mean += d / p.n;
    p.m2 += d * (s - p.mean);
    p.min = p.n == 1 ? v : fmin(p.min, v);
    p.max = p.n == 1 ? v : fmax(p.max, v);
  } else if (not_a_number(v)) {
    p.nan += 1;
  } else if (v > 0) {
    p.posinf += 1;
  }
  if (v == 0) p.zeros += 1;
}

/// Chan et al.'s merge of two (count, mean, M2), in the larger exponent.
TENSORTAP_HOST_DEVICE inline void merge(Partial& a, Partial b) {
  if (a.n == 0) {
    // Taken whole: nothing of `a`'s to weigh.
    a.n = b.n;
    a.mean = b.mean;
    a.m2 = b.m2;
    a.min = b.min;
    a.max = b.max;
    a.exp = b.exp;
  } else if (b.n > 0) {
    if (b.exp > a.exp) rescale(a, static_cast<int>(b.exp));
    if (a.exp > b.exp) rescale(b, static_cast<int>(a.exp));
    const double n = a.n + b.n;
    const double d = b.mean - a.mean;
    a.mean += d * (b.n / n);
    a.m2 += b.m2 + d * d * (a.n * b.n / n);
    a.min = fmin(a.min, b.min);
    a.max = fmax(a.max, b.max);
    a.n = n;
  }
  a.nan += b.nan;
  a.posinf += b.posinf;
  a.zeros += b.zeros;
}

/// The ten fields of `all`, the whole tensor's partial (`numel` values), in
/// TENSORTAP_STATS_FIELDS' order into `out`. The same definitions as the
/// host scan (stats.cpp): min, max, mean, std (population) and norm over
/// the finite values, NaN when there is none; norm = sqrt(M2 + n mean^2),
/// two non-negative terms, so no cancellation.
TENSORTAP_HOST_DEVICE inline void finish(const Partial& all, std::int64_t numel, double* out) {
  const double none = nan("");
  const bool any = all.n > 0;
  const int e = all.exp == kNoExponent ? 0 : static_cast<int>(all.exp);
  const double v_min = any ? all.min : none;
  const double v_max = any ? all.max : none;
  const double v_mean = any ? ldexp(all.mean, e) : none;
  const double v_std = any ? ldexp(sqrt(all.m2 / all.n), e) : none;
  const double v_norm = any ? ldexp(sqrt(all.m2 + all.n * all.mean * all.mean), e) : none;
  const double v_nan = all.nan;
  const double v_posinf = all.posinf;
  const double v_neginf = static_cast<double>(numel) - all.n - all.nan - all.posinf;
  const double v_zeros = all.zeros;
  const double v_numel = static_cast<double>(numel);
  int i = 0;
#define TENSORTAP_FIELD_(name) out[i++] = v_##name;
  TENSORTAP_STATS_FIELDS(TENSORTAP_FIELD_, TENSORTAP_FIELD_)
#undef TENSORTAP_FIELD_
}

}  // namespace tensortap::detail::fused
