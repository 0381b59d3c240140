// Device code both of tensortap's kernel files use (stats_kernel.cu,
// batch_kernel.cu): a block's merge of its threads' partial results, and a
// value of each element type the kernels read, as float64. nvcc only.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "sdk/src/cuda/stats_partial.h"

namespace tensortap::detail::fused {

/// The block's merge of each thread's `mine`, in shared memory (kThreads
/// of them), by halves: the result is in shared[0].
__device__ inline void block_merge(const Partial& mine, Partial* shared) {
  shared[threadIdx.x] = mine;
  __syncthreads();
  for (int s = kThreads / 2; s > 0; s >>= 1) {
    if (threadIdx.x < s) merge(shared[threadIdx.x], shared[threadIdx.x + s]);
    __syncthreads();
  }
}

__device__ inline double value(const float* p, std::int64_t i) { return static_cast<double>(p[i]); }
__device__ inline double value(const double* p, std::int64_t i) { return p[i]; }
__device__ inline double value(const __half* p, std::int64_t i) { return static_cast<double>(__half2float(p[i])); }
__device__ inline double value(const __nv_bfloat16* p, std::int64_t i) {
  return static_cast<double>(__bfloat162float(p[i]));
}

}  // namespace tensortap::detail::fused
