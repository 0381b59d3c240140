// A step's gradients in one launch (batch_kernel.h): the blocks of every
// tensor in one grid, each tensor's blocks as launch_fused_stats' would be,
// and the last of a tensor's blocks to finish merges their results (or,
// without counters, a second launch of one block per tensor does). The
// arithmetic is stats_partial.h's.
#include "sdk/src/cuda/batch_kernel.h"

#include "sdk/src/cuda/kernel_device.cuh"

namespace tensortap::detail {
namespace {

using fused::block_merge;
using fused::kThreads;
using fused::Partial;
using fused::value;

// The batch as the kernels' parameters: the tensors and where each one's
// blocks start in the first launch's grid (first[count] is its size).
struct BatchParams {
  BatchTensor t[kBatchTensors];
  int first[kBatchTensors + 1];
  int count;
  // One a tensor, zero (launch_batch): its blocks count themselves here.
  unsigned* counters;
};
static_assert(sizeof(BatchParams) <= 4096, "kernel parameters are at most 4 KiB");

// The stored form: the element itself, but bfloat16 widened to float32.
__device__ void store(void* copy, const float* p, std::int64_t i) { static_cast<float*>(copy)[i] = p[i]; }
__device__ void store(void* copy, const double* p, std::int64_t i) { static_cast<double*>(copy)[i] = p[i]; }
__device__ void store(void* copy, const __half* p, std::int64_t i) { static_cast<__half*>(copy)[i] = p[i]; }
__device__ void store(void* copy, const __nv_bfloat16* p, std::int64_t i) {
  static_cast<float*>(copy)[i] = __bfloat162float(p[i]);
}

// Block `b` of `blocks` of tensor `t`: its share, in launch_fused_stats'
// order (thread by thread, a grid's stride apart).
template <class T>
__device__ Partial share(const BatchTensor& t, int b, int blocks) {
  const T* data = static_cast<const T*>(t.data);
  const std::int64_t stride = static_cast<std::int64_t>(blocks) * kThreads;
  Partial mine = fused::empty_partial();
  for (std::int64_t i = static_cast<std::int64_t>(b) * kThreads + threadIdx.x; i < t.n; i += stride) {
    if (t.copy != nullptr) store(t.copy, data, i);
    if (t.stats != nullptr) fused::add(mine, value(data, i));
  }
  return mine;
}

// A partial another block wrote: read through volatile loads, past any
// copy this block's cache could hold.
__device__ Partial load_partial(const Partial* from) {
  const volatile Partial* v = from;
  Partial p;
  p.n = v->n;
  p.mean = v->mean;
  p.m2 = v->m2;
  p.min = v->min;
  p.max = v->max;
  p.nan = v->nan;
  p.posinf = v->posinf;
  p.zeros = v->zeros;
  p.exp = v->exp;
  return p;
}

// The merge of a tensor's `blocks` partials and its ten statistics, in
// batch_final's order (and so final_stats'): the same bits either way.
__device__ void merge_all(const BatchTensor& t, int blocks, Partial* shared, bool from_other_blocks) {
  const auto* partials = reinterpret_cast<const Partial*>(t.scratch);
  Partial mine = fused::empty_partial();
  for (int i = threadIdx.x; i < blocks; i += kThreads)
    fused::merge(mine, from_other_blocks ? load_partial(&partials[i]) : partials[i]);
  block_merge(mine, shared);
  if (threadIdx.x == 0) fused::finish(shared[0], t.n, t.stats);
}

// The tensor whose blocks hold this block: the last of `count` whose first
// block (`first[i]`) is at or before it.
__device__ int owner(const int* first, int count) {
  int lo = 0, hi = count - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (first[mid] <= static_cast<int>(blockIdx.x)) lo = mid;
    else hi = mid - 1;
  }
  return lo;
}

__global__ void __launch_bounds__(kThreads) batch_partials(const BatchParams p) {
  __shared__ Partial shared[kThreads];
  __shared__ bool last;
  const int lo = owner(p.first, p.count);
  const BatchTensor& t = p.t[lo];
  const int b = static_cast<int>(blockIdx.x) - p.first[lo];
  const int blocks = p.first[lo + 1] - p.first[lo];
  Partial mine = fused::empty_partial();
  switch (t.element) {
    case StatsElement::Float32: mine = share<float>(t, b, blocks); break;
    case StatsElement::Float64: mine = share<double>(t, b, blocks); break;
    case StatsElement::Float16: mine = share<__half>(t, b, blocks); break;
    case StatsElement::BFloat16: mine = share<__nv_bfloat16>(t, b, blocks); break;
  }
  // The same for every thread of the block: the merge's barriers are safe.
  if (t.stats == nullptr) return;
  block_merge(mine, shared);
  if (p.counters == nullptr) {
    if (threadIdx.x == 0) reinterpret_cast<Partial*>(t.scratch)[b] = shared[0];
    return;
  }
  // The last of the tensor's blocks to finish merges: each publishes its
  // partial (the fence orders it before the count), then counts itself.
  if (threadIdx.x == 0) {
    reinterpret_cast<Partial*>(t.scratch)[b] = shared[0];
    __threadfence();
    last = atomicAdd(&p.counters[lo], 1u) == static_cast<unsigned>(blocks - 1);
  }
  __syncthreads();
  if (!last) return;
  __threadfence();
  merge_all(t, blocks, shared, /*from_other_blocks=*/true);
  // Zero again for the slot's next launch.
  if (threadIdx.x == 0) p.counters[lo] = 0;
}

__global__ void __launch_bounds__(kThreads) batch_final(const BatchParams p) {
  __shared__ Partial shared[kThreads];
  const BatchTensor& t = p.t[blockIdx.x];
  if (t.stats == nullptr) return;
  merge_all(t, p.first[blockIdx.x + 1] - p.first[blockIdx.x], shared, /*from_other_blocks=*/false);
}

// The gather's copies as the kernel's parameters: where each tensor's
// blocks start in the grid (first[count] is its size).
struct CopyParams {
  CopyTensor t[kBatchTensors];
  int first[kBatchTensors + 1];
  int count;
};
static_assert(sizeof(CopyParams) <= 4096, "kernel parameters are at most 4 KiB");

// What one block copies (its threads 16 bytes at a time, 8 rounds): a
// tensor takes one block per share, up to kCopyBlocks, and its blocks
// stride over the rest.
constexpr std::int64_t kCopyShare = std::int64_t{kThreads} * 16 * 8;
constexpr std::int64_t kCopyBlocks = 2048;

__global__ void __launch_bounds__(kThreads) batch_copies(const CopyParams p) {
  const int lo = owner(p.first, p.count);
  const CopyTensor& t = p.t[lo];
  const std::int64_t b = static_cast<int>(blockIdx.x) - p.first[lo];
  const std::int64_t stride = static_cast<std::int64_t>(p.first[lo + 1] - p.first[lo]) * kThreads;
  const std::int64_t start = b * kThreads + threadIdx.x;
  const auto aligned = [](const void* q) { return (reinterpret_cast<std::uintptr_t>(q) & 15u) == 0; };
  if (aligned(t.from) && aligned(t.into) && t.bytes % 16 == 0) {
    const auto* from = static_cast<const uint4*>(t.from);
    auto* into = static_cast<uint4*>(t.into);
    for (std::int64_t i = start; i < t.bytes / 16; i += stride) into[i] = from[i];
  } else {
    const auto* from = static_cast<const unsigned char*>(t.from);
    auto* into = static_cast<unsigned char*>(t.into);
    for (std::int64_t i = start; i < t.bytes; i += stride) into[i] = from[i];
  }
}

}  // namespace

int launch_copies(const CopyTensor* tensors, int count, void* stream) {
  if (count <= 0) return 0;
  CopyParams p;
  p.count = count;
  p.first[0] = 0;
  for (int i = 0; i < count; ++i) {
    p.t[i] = tensors[i];
    const std::int64_t blocks = (tensors[i].bytes + kCopyShare - 1) / kCopyShare;
    // At least one block a tensor: an empty one's copies nothing.
    p.first[i + 1] = p.first[i] + static_cast<int>(blocks < 1 ? 1 : blocks > kCopyBlocks ? kCopyBlocks : blocks);
  }
  // As launch_batch: the launch's own result, no error-state calls around it.
  void* args[] = {&p};
  const cudaError_t e = cudaLaunchKernel(reinterpret_cast<const void*>(&batch_copies), dim3(p.first[count]),
                                         dim3(kThreads), args, 0, static_cast<cudaStream_t>(stream));
  if (e != cudaSuccess) cudaGetLastError();
  return static_cast<int>(e);
}

int launch_batch(const BatchTensor* tensors, int count, unsigned* counters, void* stream) {
  if (count <= 0) return 0;
  BatchParams p;
  p.count = count;
  p.counters = counters;
  p.first[0] = 0;
  bool stats = false;
  for (int i = 0; i < count; ++i) {
    p.t[i] = tensors[i];
    p.first[i + 1] = p.first[i] + stats_partials(tensors[i].n);
    stats = stats || tensors[i].stats != nullptr;
  }
  // cudaLaunchKernel, not <<<>>>: its own result says whether the launch
  // was taken, so no cudaPeekAtLastError before nor cudaGetLastError after
  // (two runtime calls a step). An error the caller's work left pending
  // stays theirs; one of ours is taken, so LibTorch's next check does not
  // find it.
  const auto s = static_cast<cudaStream_t>(stream);
  void* args[] = {&p};
  cudaError_t e = cudaLaunchKernel(reinterpret_cast<const void*>(&batch_partials), dim3(p.first[count]),
                                   dim3(kThreads), args, 0, s);
  if (e == cudaSuccess && stats && counters == nullptr)
    e = cudaLaunchKernel(reinterpret_cast<const void*>(&batch_final), dim3(count), dim3(kThreads), args, 0, s);
  if (e != cudaSuccess) cudaGetLastError();
  return static_cast<int>(e);
}

}  // namespace tensortap::detail
