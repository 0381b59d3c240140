// tensortap::perturb: a port check's noise-floor reference (docs/diff.md),
// bit-identical to tensortap.torch.perturb (python/tensortap/torch.py).
#include <tensortap/checkpoint.h>

#include <cstring>
#include <unordered_set>

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>

#include "writers/src/check.h"

namespace tensortap {
namespace {

constexpr std::uint64_t kGolden = 0x9E3779B97F4A7C15ULL;

// FNV-1a, 64 bits, of the name's bytes: the parameter's own stream, so
// the order of parameters and ties does not matter.
std::uint64_t fnv1a(const std::string& s) {
  std::uint64_t h = 0xcbf29ce484222325ULL;
  for (const char c : s) {
    h ^= static_cast<unsigned char>(c);
    h *= 0x100000001b3ULL;
  }
  return h;
}

// splitmix64's finaliser.
std::uint64_t mix(std::uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}

// `ulps` steps of a value of `Bits` (its sign bit `sign`, +inf's pattern
// `inf`) up or down, as one ordered integer: -magnitude for a negative
// value, +magnitude otherwise. Clamped to the largest finite; a result of 0
// keeps the value's own sign (nextafter's -0 from the smallest negative).
template <class Bits>
Bits move(Bits b, bool up, std::int64_t ulps, Bits sign, Bits inf) {
  const Bits magnitude = b & static_cast<Bits>(~sign);
  if (magnitude >= inf) return b;  // NaN, +-inf
  std::int64_t o = (b & sign) ? -static_cast<std::int64_t>(magnitude) : static_cast<std::int64_t>(magnitude);
  const auto top = static_cast<std::int64_t>(inf) - 1;
  o = up ? std::min(o + ulps, top) : std::max(o - ulps, -top);
  if (o == 0) return static_cast<Bits>(b & sign);
  return o > 0 ? static_cast<Bits>(o) : static_cast<Bits>(sign | static_cast<Bits>(-o));
}

template <class Bits>
void perturb_bits(Bits* data, std::int64_t n, std::uint64_t state, std::int64_t ulps, Bits sign, Bits inf) {
  for (std::int64_t k = 0; k < n; ++k) {
    const bool up = (mix(state + static_cast<std::uint64_t>(k + 1) * kGolden) >> 63) != 0;
    data[k] = move<Bits>(data[k], up, ulps, sign, inf);
  }
}

}  // namespace

void perturb(torch::nn::Module& module, std::int64_t ulps, std::uint64_t seed) {
  TENSORTAP_CHECK(ulps >= 1 && ulps <= 1024, "perturb(): ulps must be 1 to 1024, not {}", ulps);
  c10::NoGradGuard no_grad;
  std::unordered_set<const void*> seen;
  for (const auto& item : module.named_parameters(/*recurse=*/true)) {
    at::Tensor p = item.value();
    // A tensor under two names is moved once, under its first (as Python's
    // named_parameters() lists it).
    if (!p.defined() || !seen.insert(p.unsafeGetTensorImpl()).second) continue;
    const at::ScalarType t = p.scalar_type();
    if (t != at::kHalf && t != at::kBFloat16 && t != at::kFloat && t != at::kDouble) continue;
    // In logical (row-major) order, on the host, whatever its strides and device.
    at::Tensor c = p.detach().to(at::kCPU).contiguous().clone();
    const std::uint64_t state = fnv1a(item.key()) ^ (seed * kGolden);
    const std::int64_t n = c.numel();
    if (t == at::kDouble)
      perturb_bits<std::uint64_t>(static_cast<std::uint64_t*>(c.data_ptr()), n, state, ulps, 1ULL << 63,
                                  0x7FF0000000000000ULL);
    else if (t == at::kFloat)
      perturb_bits<std::uint32_t>(static_cast<std::uint32_t*>(c.data_ptr()), n, state, ulps, 1U << 31, 0x7F800000U);
    else
      perturb_bits<std::uint16_t>(static_cast<std::uint16_t*>(c.data_ptr()), n, state, ulps, 0x8000,
                                  t == at::kHalf ? 0x7C00 : 0x7F80);
    p.copy_(c);
  }
}

}  // namespace tensortap
