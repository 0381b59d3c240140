// Host references of tensortap's own CUDA kernels: what each computes, on
// the host, in the kernels' own order and arithmetic. The fake runtime runs
// them in place of the kernels (tests/cuda/fake_kernels.cpp), so the paths
// that launch kernels are tested on every machine; a [gpu] test checks the
// kernels against them on a device.
#pragma once

#include "sdk/src/cuda/batch_kernel.h"

namespace tt_test {

/// batch_kernel.cu's `launch_batch`: each tensor's stored form into `copy`
/// and its ten statistics into `stats` (memory is host memory).
void run_batch_on_host(const tensortap::detail::BatchTensor* tensors, int count);

}  // namespace tt_test
