// The statistics vector of a contiguous CUDA tensor in two kernels: each
// block reduces its share of the values to a partial result, then one block
// merges the partials and writes the ten fields. The arithmetic of both is
// stats_partial.h's, which the host tests run against the host scan.
#include "sdk/src/cuda/stats_kernel.h"

#include "sdk/src/cuda/kernel_device.cuh"

namespace tensortap::detail {
namespace {

using fused::block_merge;
using fused::kThreads;
using fused::Partial;
using fused::value;

static_assert(sizeof(Partial) == kStatsPartialDoubles * sizeof(double), "a partial is kStatsPartialDoubles doubles");

template <class T>
__global__ void __launch_bounds__(kThreads) partial_stats(const T* data, std::int64_t n, Partial* partials) {
  __shared__ Partial shared[kThreads];
  Partial mine = fused::empty_partial();
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * kThreads;
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * kThreads + threadIdx.x; i < n; i += stride)
    fused::add(mine, value(data, i));
  block_merge(mine, shared);
  if (threadIdx.x == 0) partials[blockIdx.x] = shared[0];
}

__global__ void __launch_bounds__(kThreads) final_stats(const Partial* partials, int count, std::int64_t numel,
                                                        double* out) {
  __shared__ Partial shared[kThreads];
  Partial mine = fused::empty_partial();
  for (int i = threadIdx.x; i < count; i += kThreads) fused::merge(mine, partials[i]);
  block_merge(mine, shared);
  if (threadIdx.x == 0) fused::finish(shared[0], numel, out);
}

}  // namespace

int launch_fused_stats(const void* data, StatsElement element, std::int64_t n, double* scratch, double* out,
                       void* stream) {
  // An error the caller's own work left pending is not ours to take (nor
  // to be blamed for): ATen's path, which checks, reports it.
  if (cudaPeekAtLastError() != cudaSuccess) return kStatsNotLaunched;
  const int blocks = stats_partials(n);
  const auto s = static_cast<cudaStream_t>(stream);
  auto* partials = reinterpret_cast<Partial*>(scratch);
  switch (element) {
    case StatsElement::Float32:
      partial_stats<<<blocks, kThreads, 0, s>>>(static_cast<const float*>(data), n, partials);
      break;
    case StatsElement::Float64:
      partial_stats<<<blocks, kThreads, 0, s>>>(static_cast<const double*>(data), n, partials);
      break;
    case StatsElement::Float16:
      partial_stats<<<blocks, kThreads, 0, s>>>(static_cast<const __half*>(data), n, partials);
      break;
    case StatsElement::BFloat16:
      partial_stats<<<blocks, kThreads, 0, s>>>(static_cast<const __nv_bfloat16*>(data), n, partials);
      break;
  }
  final_stats<<<1, kThreads, 0, s>>>(partials, blocks, n, out);
  // Taken, not peeked: an error of ours must not be left for LibTorch's next
  // check to find.
  return static_cast<int>(cudaGetLastError());
}

}  // namespace tensortap::detail
