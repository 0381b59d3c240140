// The CUDA glue of a build whose LibTorch has no CUDA: there are no CUDA
// tensors to capture, so the core never gets an engine.

#include "sdk/src/cuda/capture.h"
#include "writers/src/check.h"
#include "writers/src/dtypes.h"

namespace tensortap::detail {

std::shared_ptr<CudaEngine> make_cuda_engine(Staging&, std::size_t, std::function<void(const std::string&)>, bool,
                                             bool) {
  return nullptr;
}

bool cuda_capture(CudaEngine&, const RecordSpec& spec, const at::Tensor& tensor, bool) {
  fail("cannot capture '{}' ({}): tensortap was built without its CUDA engine", spec.name, describe_tensor(tensor));
}

at::Tensor fused_device_stats(const at::Tensor&) { return {}; }

std::optional<bool> cuda_capture_fused_stats(CudaEngine&, const RecordSpec&, const at::Tensor&, bool) {
  return std::nullopt;
}

bool cuda_batches(const CudaEngine&) noexcept { return false; }

bool cuda_batchable(const at::Tensor&, const DtypeInfo&) { return false; }

void cuda_capture_batch(CudaEngine&, std::vector<CudaBatchEntry>&, bool) {}

void cuda_gather(const std::vector<at::Tensor>& from, std::vector<at::Tensor>& into) {
  for (std::size_t i = 0; i < from.size(); ++i) into[i].copy_(from[i]);
}

void cuda_end_step(CudaEngine&) noexcept {}

void cuda_flush(CudaEngine&) {}

void cuda_stop(CudaEngine&) {}

std::uint64_t cuda_captures() noexcept { return 0; }

}  // namespace tensortap::detail
