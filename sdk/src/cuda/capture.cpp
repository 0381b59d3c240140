// The LibTorch side of CUDA capture: everything here that needs CUDA
// LibTorch is the current stream, a device guard, and ATen's copy for
// snapshots that are not a plain byte copy. The rest is the engine's.
//
// Built only when LibTorch has CUDA (TENSORTAP_HAVE_CUDA); otherwise
// capture_none.cpp stands in.

#include "sdk/src/cuda/capture.h"

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <optional>
#include <vector>

#include <ATen/ATen.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <fmt/format.h>

#include <tensortap/error.h>

#include "sdk/src/cuda/capture_core.h"
#include "sdk/src/cuda/engine.h"
#include "sdk/src/cuda/pinned.h"
#include "sdk/src/core/snapshot.h"
#include "sdk/src/core/stats.h"
#ifdef TENSORTAP_HAVE_FUSED_STATS
#include "sdk/src/cuda/batch.h"
#include "sdk/src/cuda/stats_kernel.h"
#endif
#include "writers/src/check.h"
#include "writers/src/dtypes.h"

namespace tensortap::detail {
namespace {

// The engine's arenas from torch's caching allocator: they count in torch's
// memory statistics and its memory fraction, come out of what torch has
// cached (in training, that is usually all the free memory), and go back to
// the cache without the device synchronization of a cudaFree.
DeviceMemory torch_device_memory() {
  DeviceMemory m;
  m.allocate = [](int device, std::size_t bytes) -> void* {
    const auto index = static_cast<c10::DeviceIndex>(device);
    // raw_alloc_with_stream allocates on the current device.
    c10::cuda::CUDAGuard guard(index);
    // Associated with the device's current stream, the training stream:
    // once given back (when every copy from the arena has completed), the
    // block serves that stream's allocations.
    return c10::cuda::CUDACachingAllocator::raw_alloc_with_stream(bytes,
                                                                  c10::cuda::getCurrentCUDAStream(index).stream());
  };
  m.release = [](int, void* data) { c10::cuda::CUDACachingAllocator::raw_delete(data); };
  return m;
}

}  // namespace

std::shared_ptr<CudaEngine> make_cuda_engine(Staging& staging, std::size_t device_bytes,
                                             std::function<void(const std::string&)> report, bool stats_in_arena,
                                             bool batch_events) {
  if (cuda_device_count() == 0) return nullptr;
  CudaEngineOptions options;
  options.stats_in_arena = stats_in_arena;
  options.batch_events = batch_events;
  options.device_bytes = device_bytes;
  options.large_bytes = device_bytes;
  options.staging_memory = pinned_host_memory();
  options.arena_memory = torch_device_memory();
  return std::make_shared<CudaEngine>(staging, options, std::move(report));
}

#ifdef TENSORTAP_HAVE_FUSED_STATS
namespace {

// Once a launch has failed (a driver older than the kernels' PTX, say),
// every later tensor takes ATen's path at once.
std::atomic<bool> fused_broken{false};

// The fused kernels' element type for `tensor`, or nullopt where they do not
// take it.
std::optional<StatsElement> fused_element(const at::Tensor& tensor) {
  StatsElement element;
  switch (tensor.scalar_type()) {
    case at::kFloat: element = StatsElement::Float32; break;
    case at::kDouble: element = StatsElement::Float64; break;
    case at::kHalf: element = StatsElement::Float16; break;
    case at::kBFloat16: element = StatsElement::BFloat16; break;
    default: return std::nullopt;
  }
  // A negated or conjugated view's bytes are not its values; ATen's path
  // reads those right.
  if (!tensor.is_cuda() || !tensor.is_contiguous() || tensor.numel() == 0 || tensor.is_neg() || tensor.is_conj())
    return std::nullopt;
  if (fused_broken.load(std::memory_order_relaxed)) return std::nullopt;
  return element;
}

// A launch that failed: ATen's path for this tensor and every later one;
// said once.
void fused_failed(const at::Tensor& tensor, int error) {
  if (!fused_broken.exchange(true))
    std::fprintf(stderr,
                 "tensortap: its statistics kernels could not be launched on %s (CUDA error %d): statistics of CUDA "
                 "tensors go through ATen's reductions from now on\n",
                 tensor.device().str().c_str(), error);
}

}  // namespace
#endif

at::Tensor fused_device_stats(const at::Tensor& tensor) {
#ifdef TENSORTAP_HAVE_FUSED_STATS
  const std::optional<StatsElement> element = fused_element(tensor);
  if (!element) return {};
  const c10::cuda::CUDAGuard guard(tensor.device());
  const auto dbl = at::TensorOptions().dtype(at::kDouble).device(tensor.device());
  // From the caching allocator, on the current stream: the scratch goes back
  // to it when this returns, reusable by that stream's later work only.
  at::Tensor out = at::empty({kStatsVectorSize}, dbl);
  const at::Tensor scratch = at::empty({std::int64_t{stats_partials(tensor.numel())} * kStatsPartialDoubles}, dbl);
  const int error =
      launch_fused_stats(tensor.data_ptr(), *element, tensor.numel(), scratch.data_ptr<double>(),
                         out.data_ptr<double>(), c10::cuda::getCurrentCUDAStream(tensor.device().index()).stream());
  if (error == kStatsNotLaunched) return {};
  if (error != 0) {
    fused_failed(tensor, error);
    return {};
  }
  return out;
#else
  (void)tensor;
  return {};
#endif
}

namespace {

// A CUDA tensor as capture_on_engine sees it.
class TensorSource {
 public:
  TensorSource(const RecordSpec& spec, const at::Tensor& tensor) : spec_(spec), tensor_(tensor) {}
  bool byte_copy() const { return is_byte_copy(tensor_, spec_.dtype.stored); }
  const void* bytes() const { return bytes_of(tensor_); }
  // Strided views, and bfloat16 widened to float32 (what the writers
  // store), on the device. The target device is given, so ATen does not
  // look the pointer up.
  void copy_into(void* dst, cudaStream_t) {
    at::for_blob(dst, tensor_.sizes())
        .options(at::TensorOptions().dtype(spec_.dtype.stored).device(tensor_.device()))
        .target_device(tensor_.device())
        .make_tensor()
        .copy_(tensor_);
  }
  // From LibTorch's caching allocator (no cudaMalloc once warm), on the
  // current stream.
  void* own_snapshot(std::function<void()>& release) {
    at::Tensor own = at::empty(tensor_.sizes(), at::TensorOptions().dtype(spec_.dtype.stored).device(tensor_.device()));
    void* data = own.data_ptr();
    release = [own]() mutable { own.reset(); };
    return data;
  }
  std::string describe() const {
    return fmt::format("'{}' (kind {}, step {}, {})", spec_.name, kind_name(spec_.kind), spec_.step,
                       describe_tensor(tensor_));
  }

 private:
  const RecordSpec& spec_;
  const at::Tensor& tensor_;
};

}  // namespace

bool cuda_capture(CudaEngine& engine, const RecordSpec& spec, const at::Tensor& tensor, bool may_drop) {
  TensorSource source(spec, tensor);
  const c10::Device device = tensor.device();
  if (!device.is_cuda() || !device.has_index())
    fail("cuda_capture() of {}, which is not on a CUDA device", source.describe());
  // Autograd runs a CUDA backward on its own thread, with the op's stream
  // current there: the current stream of the tensor's device is the one its
  // producer used, whatever thread this is.
  c10::cuda::CUDAGuard guard(device);
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream(device.index()).stream();
  return capture_on_engine(engine, spec, device.index(), stream, source, may_drop);
}

std::optional<bool> cuda_capture_fused_stats(CudaEngine& engine, const RecordSpec& spec, const at::Tensor& tensor,
                                             bool may_drop) {
#ifdef TENSORTAP_HAVE_FUSED_STATS
  if (!engine.stats_in_arena()) return std::nullopt;
  const std::optional<StatsElement> element = fused_element(tensor);
  if (!element) return std::nullopt;
  const c10::Device device = tensor.device();
  const c10::cuda::CUDAGuard guard(device);
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream(device.index()).stream();
  if (graph_check_due(engine, stream)) {
    cudaStreamCaptureStatus graph = cudaStreamCaptureStatusNone;
    if (cudaStreamIsCapturing(stream, &graph) != cudaSuccess) cudaGetLastError();
    if (graph != cudaStreamCaptureStatusNone)
      fail("cannot capture the statistics of '{}' (kind {}, step {}, {}) while its stream is being captured into "
           "a CUDA graph",
           spec.name, kind_name(spec.kind), spec.step, describe_tensor(tensor));
  }
  // The ten values first, then the kernels' partial results: one region,
  // given back once the ten are in host memory (which is after the kernels
  // ran: the copy waits for the event recorded after them).
  constexpr std::size_t kOut = kStatsVectorSize * sizeof(double);
  constexpr std::size_t kScratchAt = 128;  // aligned as an allocation's start, for the kernels' loads
  static_assert(kOut <= kScratchAt);
  const std::size_t scratch =
      static_cast<std::size_t>(stats_partials(tensor.numel())) * kStatsPartialDoubles * sizeof(double);
  std::optional<CudaEngine::Snapshot> snap;
  try {
    snap = engine.reserve(device.index(), kScratchAt + scratch, may_drop);
  } catch (const std::exception& e) {
    fail("cannot capture the statistics of '{}' (kind {}, step {}): {}", spec.name, kind_name(spec.kind), spec.step,
         e.what());
  }
  if (!snap) return false;
  if (snap->external || snap->data == nullptr) {
    // No arena on this device (or scratch past it): the tensor path.
    engine.cancel(*snap, stream, {});
    return std::nullopt;
  }
  auto* out = static_cast<double*>(snap->data);
  const int error = launch_fused_stats(tensor.data_ptr(), *element, tensor.numel(),
                                       out + kScratchAt / sizeof(double), out, static_cast<void*>(stream));
  if (error != 0) {
    engine.cancel(*snap, stream, {});
    if (error != kStatsNotLaunched) fused_failed(tensor, error);
    return std::nullopt;
  }
  // Only the ten values go to the host; the region is freed whole.
  snap->nbytes = kOut;
  engine.submit(*snap, stream, spec, sizeof(double), {});
  count_cuda_capture();
  return true;
#else
  (void)engine;
  (void)spec;
  (void)tensor;
  (void)may_drop;
  return std::nullopt;
#endif
}

bool cuda_batches(const CudaEngine& engine) noexcept {
#ifdef TENSORTAP_HAVE_FUSED_STATS
  return engine.batch_events() && !fused_broken.load(std::memory_order_relaxed);
#else
  (void)engine;
  return false;
#endif
}

bool cuda_batchable(const at::Tensor& tensor, const DtypeInfo& dtype) {
#ifdef TENSORTAP_HAVE_FUSED_STATS
  const std::optional<StatsElement> element = fused_element(tensor);
  // The stored form the batch writes: the tensor's own, bfloat16 widened.
  return element && !dtype.bits &&
         dtype.stored == (*element == StatsElement::BFloat16 ? at::kFloat : tensor.scalar_type());
#else
  (void)tensor;
  (void)dtype;
  return false;
#endif
}

void cuda_capture_batch(CudaEngine& engine, std::vector<CudaBatchEntry>& entries, bool may_drop) {
#ifdef TENSORTAP_HAVE_FUSED_STATS
  static const std::int64_t kSizes[1] = {kStatsVectorSize};
  const DtypeInfo& f64 = *dtype_info(at::kDouble);
  // One batch a device, each in the order its entries came.
  std::vector<std::size_t> order(entries.size());
  for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
    return entries[a].tensor.device().index() < entries[b].tensor.device().index();
  });
  for (std::size_t from = 0; from < order.size();) {
    const c10::Device device = entries[order[from]].tensor.device();
    std::size_t to = from;
    while (to < order.size() && entries[order[to]].tensor.device() == device) ++to;
    const c10::cuda::CUDAGuard guard(device);
    const cudaStream_t stream = c10::cuda::getCurrentCUDAStream(device.index()).stream();
    std::vector<RecordSpec> specs;
    specs.reserve(to - from);
    std::vector<BatchItem> items(to - from);
    for (std::size_t k = 0; k < items.size(); ++k) {
      CudaBatchEntry& e = entries[order[from + k]];
      const bool stats = e.op == Op::StatsVector;
      const StatsElement element = *fused_element(e.tensor);
      specs.push_back(RecordSpec{e.kind, e.name, e.step, stats ? f64 : *e.dtype,
                                 stats ? at::IntArrayRef(kSizes, 1) : e.tensor.sizes(),
                                 stats ? static_cast<std::uint64_t>(kStatsVectorSize) * sizeof(double)
                                       : static_cast<std::uint64_t>(batch_copy_bytes(element, e.tensor.numel())),
                                 e.op, e.stats_row, e.scan, e.id, /*name_kept=*/false});
      items[k].tensor.data = e.tensor.data_ptr();
      items[k].tensor.n = e.tensor.numel();
      items[k].tensor.element = element;
      (stats ? items[k].stats : items[k].full) = &specs.back();
    }
    capture_batch_on_engine(engine, device.index(), stream, items.data(), items.size(), may_drop);
    for (std::size_t k = 0; k < items.size(); ++k) {
      entries[order[from + k]].queued = items[k].queued > 0;
      entries[order[from + k]].left = items[k].left;
    }
    from = to;
  }
#else
  (void)engine;
  (void)may_drop;
  for (CudaBatchEntry& e : entries) e.left = true;
#endif
}

void cuda_gather(const std::vector<at::Tensor>& from, std::vector<at::Tensor>& into) {
#ifdef TENSORTAP_HAVE_FUSED_STATS
  // A device's tensors at a time, up to kBatchTensors a launch.
  std::vector<char> done(from.size(), 0);
  std::vector<CopyTensor> batch;
  for (std::size_t first = 0; first < from.size(); ++first) {
    if (done[first]) continue;
    const c10::Device device = from[first].device();
    const c10::cuda::CUDAGuard guard(device);
    const cudaStream_t stream = c10::cuda::getCurrentCUDAStream(device.index()).stream();
    std::vector<std::size_t> taken;
    const auto launch = [&] {
      if (batch.empty()) return;
      const int error = fused_broken.load(std::memory_order_relaxed)
                            ? -1
                            : launch_copies(batch.data(), static_cast<int>(batch.size()), stream);
      if (error != 0) {
        if (error > 0) fused_failed(from[taken.front()], error);
        for (const std::size_t i : taken) into[i].copy_(from[i]);
      }
      batch.clear();
      taken.clear();
    };
    for (std::size_t i = first; i < from.size(); ++i) {
      if (done[i] || from[i].device() != device) continue;
      done[i] = 1;
      const at::Tensor& f = from[i];
      at::Tensor& t = into[i];
      // Bytes for bytes only where both are the same contiguous values.
      if (!f.is_contiguous() || !t.is_contiguous() || f.scalar_type() != t.scalar_type() ||
          f.numel() != t.numel() || f.is_neg() || f.is_conj() || t.device() != device) {
        t.copy_(f);
        continue;
      }
      batch.push_back(CopyTensor{f.data_ptr(), t.data_ptr(), static_cast<std::int64_t>(f.nbytes())});
      taken.push_back(i);
      if (static_cast<int>(batch.size()) == kBatchTensors) launch();
    }
    launch();
  }
#else
  for (std::size_t i = 0; i < from.size(); ++i) into[i].copy_(from[i]);
#endif
}

void cuda_end_step(CudaEngine& engine) noexcept { engine.end_step(); }

void cuda_flush(CudaEngine& engine) { engine.flush(); }

void cuda_stop(CudaEngine& engine) { engine.stop(); }

std::uint64_t cuda_captures() noexcept { return counted_cuda_captures(); }

}  // namespace tensortap::detail
