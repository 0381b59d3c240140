#pragma once

#include <cstddef>
#include <cstdint>

#include <ATen/core/Tensor.h>
#include <c10/core/ScalarType.h>

#include "writers/src/dtypes.h"
#include "writers/src/stats_file.h"

namespace tensortap::detail {

/// Statistics of a record's bytes (C order, elements as staged: bool,
/// integers, float16, float32, float64, complex, float8 codes), fed chunk by
/// chunk in order. Complex values count by magnitude; float8 codes by the
/// value they encode. Sums are in double, and chunks
/// are merged with Chan's formula, so std is as exact as NumPy's in float64
/// however the record was chunked.
class StatsAccumulator {
 public:
  explicit StatsAccumulator(Element stored) : stored_(stored) {}
  /// `nbytes` must be whole elements.
  void add(const void* data, std::size_t nbytes);
  TensorStats result() const;

  // Per-chunk figures, merged into the totals; public for the dtype loops.
  struct Part {
    std::int64_t finite = 0;
    // m2 and sumsq are in units of 2^(2 exp): squares of values near
    // DBL_MAX overflow and of subnormal ones vanish, so such values are
    // summed scaled by 2^-exp (exp = 0 for every other chunk).
    double mean = 0, m2 = 0, sumsq = 0;
    int exp = 0;
    double min = 0, max = 0;
    std::int64_t nan = 0, posinf = 0, neginf = 0, zeros = 0, numel = 0;
  };

 private:
  Element stored_;
  Part total_;
};

/// Converts the `nbytes` of stored elements at `data` (whole elements) to
/// the values the statistics see (complex: the modulus; float8: the value
/// its code encodes), one double per element into `out`.
void values_of(Element stored, const void* data, std::size_t nbytes, double* out);

/// The number of values in a statistics vector (see `device_stats`).
constexpr std::int64_t kStatsVectorSize = kStatsFields;

/// The statistics of `t` computed by ATen ops on `t`'s own device, as a
/// float64 tensor of `kStatsVectorSize` values on that device, in the
/// schema's order (TENSORTAP_STATS_FIELDS). Queues work on the current stream and never waits for it:
/// only these ten numbers need cross to the host.
at::Tensor device_stats(const at::Tensor& t);

/// Reads a statistics vector back.
TensorStats stats_from_vector(const double* v);

}  // namespace tensortap::detail
