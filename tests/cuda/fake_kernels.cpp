// tensortap's kernels on the fake runtime (tests/cuda/fake_cudart.cpp):
// each launch function runs its kernel's host reference
// (tests/cuda/kernel_reference.h) on the stream, making the runtime calls
// the real one makes (so bench_cuda_host counts them): the launches.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "sdk/src/cuda/batch_kernel.h"
#include "tests/cuda/kernel_reference.h"

extern "C" cudaError_t tensortap_fake_cudart_launch(cudaStream_t stream, int launches, const void* params,
                                                    size_t size, void (*kernel)(const void* params));

namespace tensortap::detail {
namespace {

struct BatchParams {
  BatchTensor t[kBatchTensors];
  int count;
  unsigned* counters;
};

// The counters' discipline, which the real kernel relies on: zero when a
// launch takes them (else a slot went back before its launch ran), held
// (here: 1) until the launch has run on its stream, zero again after.
void take_counters(unsigned* counters, int count) {
  for (int i = 0; i < count; ++i)
    if (__atomic_exchange_n(&counters[i], 1u, __ATOMIC_ACQ_REL) != 0) {
      std::fprintf(stderr, "fake launch_batch: counter %d of slot %p in use: the slot went back too early\n", i,
                   static_cast<void*>(counters));
      std::abort();
    }
}

}  // namespace

int launch_batch(const BatchTensor* tensors, int count, unsigned* counters, void* stream) {
  if (count <= 0) return 0;
  BatchParams p;
  p.count = std::min(count, kBatchTensors);
  p.counters = counters;
  if (counters != nullptr) take_counters(counters, p.count);
  bool stats = false;
  for (int i = 0; i < p.count; ++i) {
    p.t[i] = tensors[i];
    stats = stats || tensors[i].stats != nullptr;
  }
  return static_cast<int>(tensortap_fake_cudart_launch(
      static_cast<cudaStream_t>(stream), stats && counters == nullptr ? 2 : 1, &p, sizeof p, [](const void* raw) {
        const auto& params = *static_cast<const BatchParams*>(raw);
        tt_test::run_batch_on_host(params.t, params.count);
        if (params.counters != nullptr)
          for (int i = 0; i < params.count; ++i) __atomic_store_n(&params.counters[i], 0u, __ATOMIC_RELEASE);
      }));
}

int launch_copies(const CopyTensor* tensors, int count, void* stream) {
  if (count <= 0) return 0;
  struct CopyParams {
    CopyTensor t[kBatchTensors];
    int count;
  } p;
  p.count = std::min(count, kBatchTensors);
  std::copy(tensors, tensors + p.count, p.t);
  return static_cast<int>(
      tensortap_fake_cudart_launch(static_cast<cudaStream_t>(stream), 1, &p, sizeof p, [](const void* raw) {
        const auto& params = *static_cast<const CopyParams*>(raw);
        // The kernel's reference: its bytes.
        for (int i = 0; i < params.count; ++i)
          std::memcpy(params.t[i].into, params.t[i].from, static_cast<std::size_t>(params.t[i].bytes));
      }));
}

}  // namespace tensortap::detail
