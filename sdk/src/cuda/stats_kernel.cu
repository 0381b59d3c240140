// The statistics vector of a contiguous CUDA tensor in two kernels: each
// block reduces its share of the values to a partial result (Welford's count,
// mean and M2 of the finite values in float64, their min and max, the NaN, +Inf
// and zero counts), then one block merges the partials (Chan's formula) and
// writes the ten fields. The same definitions as the host scan (stats.cpp):
// min, max, mean, std (population) and norm over the finite values, NaN
// when there is none; norm = sqrt(M2 + n mean^2), two non-negative terms.
#include "sdk/src/cuda/stats_kernel.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

namespace tensortap::detail {
namespace {

constexpr int kThreads = 256;
constexpr int kMaxPartials = 1024;
// Values a thread takes before another block is worth launching.
constexpr std::int64_t kPerThread = 16;

// kStatsPartialDoubles float64 values: the scratch's layout.
struct Partial {
  double n, mean, m2, min, max, nan, posinf, zeros;
};
static_assert(sizeof(Partial) == kStatsPartialDoubles * sizeof(double), "a partial is kStatsPartialDoubles doubles");

__device__ Partial empty_partial() {
  Partial p;
  p.n = p.mean = p.m2 = p.nan = p.posinf = p.zeros = 0;
  p.min = __longlong_as_double(0x7ff0000000000000LL);   // +Inf
  p.max = __longlong_as_double(0xfff0000000000000ULL);  // -Inf
  return p;
}

__device__ void add(Partial& a, double v) {
  if (isfinite(v)) {
    a.n += 1;
    const double d = v - a.mean;
    a.mean += d / a.n;
    a.m2 += d * (v - a.mean);
    a.min = fmin(a.min, v);
    a.max = fmax(a.max, v);
  } else if (isnan(v)) {
    a.nan += 1;
  } else if (v > 0) {
    a.posinf += 1;
  }
  if (v == 0) a.zeros += 1;
}

__device__ void merge(Partial& a, const Partial& b) {
  if (a.n == 0) {
    // Taken whole: Chan's formula would compute d * d * 0, which is NaN
    // once d * d overflows (a mean past 1e154).
    a.n = b.n;
    a.mean = b.mean;
    a.m2 = b.m2;
    a.min = b.min;
    a.max = b.max;
  } else if (b.n > 0) {
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

// The block's merge, in shared memory; the result is in shared[0].
__device__ void block_merge(const Partial& mine, Partial* shared) {
  shared[threadIdx.x] = mine;
  __syncthreads();
  for (int s = kThreads / 2; s > 0; s >>= 1) {
    if (threadIdx.x < s) merge(shared[threadIdx.x], shared[threadIdx.x + s]);
    __syncthreads();
  }
}

__device__ double value(const float* p, std::int64_t i) { return static_cast<double>(p[i]); }
__device__ double value(const double* p, std::int64_t i) { return p[i]; }
__device__ double value(const __half* p, std::int64_t i) { return static_cast<double>(__half2float(p[i])); }
__device__ double value(const __nv_bfloat16* p, std::int64_t i) {
  return static_cast<double>(__bfloat162float(p[i]));
}

template <class T>
__global__ void __launch_bounds__(kThreads) partial_stats(const T* data, std::int64_t n, Partial* partials) {
  __shared__ Partial shared[kThreads];
  Partial mine = empty_partial();
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * kThreads;
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * kThreads + threadIdx.x; i < n; i += stride)
    add(mine, value(data, i));
  block_merge(mine, shared);
  if (threadIdx.x == 0) partials[blockIdx.x] = shared[0];
}

__global__ void __launch_bounds__(kThreads) final_stats(const Partial* partials, int count, std::int64_t numel,
                                                        double* out) {
  __shared__ Partial shared[kThreads];
  Partial mine = empty_partial();
  for (int i = threadIdx.x; i < count; i += kThreads) merge(mine, partials[i]);
  block_merge(mine, shared);
  if (threadIdx.x != 0) return;
  const Partial& all = shared[0];
  const double nan = __longlong_as_double(0x7ff8000000000000LL);
  const bool any = all.n > 0;
  // TENSORTAP_STATS_FIELDS: min max mean std norm nan posinf neginf zeros numel.
  out[0] = any ? all.min : nan;
  out[1] = any ? all.max : nan;
  out[2] = any ? all.mean : nan;
  out[3] = any ? sqrt(all.m2 / all.n) : nan;
  out[4] = any ? sqrt(all.m2 + all.n * all.mean * all.mean) : nan;
  out[5] = all.nan;
  out[6] = all.posinf;
  out[7] = static_cast<double>(numel) - all.n - all.nan - all.posinf;
  out[8] = all.zeros;
  out[9] = static_cast<double>(numel);
}

}  // namespace

int stats_partials(std::int64_t n) {
  const std::int64_t per_block = kThreads * kPerThread;
  const std::int64_t blocks = (n + per_block - 1) / per_block;
  return static_cast<int>(blocks < 1 ? 1 : blocks > kMaxPartials ? kMaxPartials : blocks);
}

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
