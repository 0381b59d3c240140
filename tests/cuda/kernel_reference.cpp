#include "tests/cuda/kernel_reference.h"

#include <cstring>

#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include "tests/support/fused_reference.h"

namespace tt_test {
namespace {

using tensortap::detail::BatchTensor;
using tensortap::detail::StatsElement;

template <class T, class Stored>
void run(const BatchTensor& t) {
  const T* data = static_cast<const T*>(t.data);
  if (t.copy != nullptr)
    for (std::int64_t i = 0; i < t.n; ++i) static_cast<Stored*>(t.copy)[i] = static_cast<Stored>(data[i]);
  if (t.stats != nullptr)
    fused_stats_on_host(t.n, [&](std::int64_t i) { return static_cast<double>(static_cast<float>(data[i])); }, t.stats);
}

// float64 read as itself, not through float.
template <>
void run<double, double>(const BatchTensor& t) {
  const auto* data = static_cast<const double*>(t.data);
  if (t.copy != nullptr && t.n > 0) std::memcpy(t.copy, data, static_cast<std::size_t>(t.n) * sizeof(double));
  if (t.stats != nullptr) fused_stats_on_host(t.n, [&](std::int64_t i) { return data[i]; }, t.stats);
}

}  // namespace

void run_batch_on_host(const BatchTensor* tensors, int count) {
  for (int i = 0; i < count; ++i) {
    const BatchTensor& t = tensors[i];
    switch (t.element) {
      case StatsElement::Float32: run<float, float>(t); break;
      case StatsElement::Float64: run<double, double>(t); break;
      case StatsElement::Float16: run<c10::Half, c10::Half>(t); break;
      case StatsElement::BFloat16: run<c10::BFloat16, float>(t); break;
    }
  }
}

}  // namespace tt_test
