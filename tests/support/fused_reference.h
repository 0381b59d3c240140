// The fused statistics kernels' reduction (stats_kernel.cu, and each
// tensor of batch_kernel.cu) run on the host with their own arithmetic
// (stats_partial.h): the same blocks, each thread's values in the same
// order, the same merge trees. What the kernels compute is then checked on
// every machine (test_stats.cpp, against the host scan), and the fake
// runtime's kernels (tests/cuda/kernel_reference.cpp) compute exactly it.
#pragma once

#include <cstdint>
#include <vector>

#include "sdk/src/cuda/stats_kernel.h"
#include "sdk/src/cuda/stats_partial.h"

namespace tt_test {

/// The ten statistics of the `n` values `value(i)` (as double) into `out`,
/// as the kernels compute them.
template <class Value>
void fused_stats_on_host(std::int64_t n, const Value& value, double* out) {
  namespace fused = tensortap::detail::fused;
  const int blocks = tensortap::detail::stats_partials(n);
  const auto tree = [](std::vector<fused::Partial>& shared) {
    for (int s = fused::kThreads / 2; s > 0; s >>= 1)
      for (int t = 0; t < s; ++t) fused::merge(shared[t], shared[t + s]);
    return shared[0];
  };
  std::vector<fused::Partial> partials(static_cast<std::size_t>(blocks)), shared(fused::kThreads);
  const std::int64_t stride = std::int64_t{blocks} * fused::kThreads;
  for (int b = 0; b < blocks; ++b) {
    for (int t = 0; t < fused::kThreads; ++t) {
      shared[t] = fused::empty_partial();
      for (std::int64_t i = std::int64_t{b} * fused::kThreads + t; i < n; i += stride) fused::add(shared[t], value(i));
    }
    partials[static_cast<std::size_t>(b)] = tree(shared);
  }
  for (int t = 0; t < fused::kThreads; ++t) {
    shared[t] = fused::empty_partial();
    for (int i = t; i < blocks; i += fused::kThreads) fused::merge(shared[t], partials[static_cast<std::size_t>(i)]);
  }
  fused::finish(tree(shared), n, out);
}

}  // namespace tt_test
