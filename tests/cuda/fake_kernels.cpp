// tensortap's kernels on the fake runtime (tests/cuda/fake_cudart.cpp):
// each launch function runs its kernel's host reference
// (tests/cuda/kernel_reference.h) on the stream, making the runtime calls
// the real one makes (so bench_cuda_host counts them): the launches.
#include <cuda_runtime_api.h>

#include <algorithm>

#include "sdk/src/cuda/batch_kernel.h"
#include "tests/cuda/kernel_reference.h"

extern "C" cudaError_t tensortap_fake_cudart_launch(cudaStream_t stream, int launches, const void* params,
                                                    size_t size, void (*kernel)(const void* params));

namespace tensortap::detail {
namespace {

struct BatchParams {
  BatchTensor t[kBatchTensors];
  int count;
};

}  // namespace

int launch_batch(const BatchTensor* tensors, int count, void* stream) {
  if (count <= 0) return 0;
  BatchParams p;
  p.count = std::min(count, kBatchTensors);
  bool stats = false;
  for (int i = 0; i < p.count; ++i) {
    p.t[i] = tensors[i];
    stats = stats || tensors[i].stats != nullptr;
  }
  return static_cast<int>(tensortap_fake_cudart_launch(
      static_cast<cudaStream_t>(stream), stats ? 2 : 1, &p, sizeof p, [](const void* raw) {
        const auto& params = *static_cast<const BatchParams*>(raw);
        tt_test::run_batch_on_host(params.t, params.count);
      }));
}

}  // namespace tensortap::detail
