// The statistics contract: the ten fields every path computes, defined
// once. No other header here, so that nvcc compiles it for the fused
// kernels (sdk/src/cuda/stats_kernel.cu) without LibTorch or the library's
// own headers.
//
// Each path ties itself to the list by writing its fields through
// TENSORTAP_STATS_FIELDS from locals named v_<field> (the host scan's
// StatsAccumulator::result, ATen's stats_vector, the kernels' finish): a
// field added here that a path does not compute is a compile error there,
// not a column of zeros.
#pragma once

/// The statistics schema, in its one order: stats.npy's columns after step
/// and series, the device statistics vector (sdk/src/core/stats.h), and the
/// members of TensorStats and of the public TensorSummary. `REAL(name)` for
/// the float64 fields, `COUNT(name)` for the int64 counts. Python's
/// STATS_FIELDS reads the same names from the file's header.
#define TENSORTAP_STATS_FIELDS(REAL, COUNT) \
  REAL(min) REAL(max) REAL(mean) REAL(std) REAL(norm) COUNT(nan) COUNT(posinf) COUNT(neginf) COUNT(zeros) COUNT(numel)

namespace tensortap::detail {

/// How many fields the schema has, and how many of them are float64 (they
/// come first).
#define TENSORTAP_ONE_(name) +1
constexpr int kStatsFields = 0 TENSORTAP_STATS_FIELDS(TENSORTAP_ONE_, TENSORTAP_ONE_);
#define TENSORTAP_NONE_(name)
constexpr int kStatsRealFields = 0 TENSORTAP_STATS_FIELDS(TENSORTAP_ONE_, TENSORTAP_NONE_);
#undef TENSORTAP_ONE_
#undef TENSORTAP_NONE_

/// Magnitudes whose squares neither overflow nor vanish, even summed over
/// 2^60 elements. Every path sums values beyond them scaled by a power of
/// two (unscaled, five finite float64 values of 1e300 gave std NaN and norm
/// inf, five of 1e-310 norm 0), the exponent of the largest magnitude, so
/// the three paths agree at the extremes too.
constexpr double kStatsSafeHigh = 0x1p450;
constexpr double kStatsSafeLow = 0x1p-450;

}  // namespace tensortap::detail
