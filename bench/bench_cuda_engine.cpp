// Device-to-host throughput of the CUDA engine against its limit, measured
// in the same run: plain cudaMemcpyAsync of the same bytes into pinned
// memory.
//
//   build/bench/bench_cuda_engine
//
// BM_PinnedMemcpyD2H/<bytes>: copies of <bytes> each, back to back on one
// stream, into one pinned buffer; an iteration moves max(<bytes>, 64 MiB)
// and waits for the stream. BM_EngineD2H/<bytes>: the same bytes as records
// of <bytes>, each snapshotted on the device (reserve, device copy, submit)
// and taken by the engine into pinned staging buffers (64 MiB each), which a
// stand-in writer hands straight back: the engine's own cost, without the
// disk's. An iteration ends when everything is in staging. The target is a
// ratio of 0.85 or more from 1 MiB up. BM_RuntimeFloor (below): the cost of
// a capture's two runtime calls on their own.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <memory>
#include <thread>

#include <benchmark/benchmark.h>

#include "sdk/src/cuda/engine.h"
#include "sdk/src/cuda/pinned.h"
#include "sdk/src/core/staging.h"

namespace {

using tensortap::detail::CudaEngine;
using tensortap::detail::CudaEngineOptions;
using tensortap::detail::RecordDesc;
using tensortap::detail::Staging;

constexpr std::size_t kStaging = std::size_t{64} << 20;
constexpr std::size_t kPerIteration = std::size_t{64} << 20;

bool have_gpu(benchmark::State& state) {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
    cudaGetLastError();
    state.SkipWithError("no CUDA device");
    return false;
  }
  return true;
}

void BM_PinnedMemcpyD2H(benchmark::State& state) {
  if (!have_gpu(state)) return;
  const auto size = static_cast<std::size_t>(state.range(0));
  const std::size_t total = std::max(size, kPerIteration);
  void* src = nullptr;
  void* dst = nullptr;
  cudaStream_t stream;
  cudaSetDevice(0);
  if (cudaMalloc(&src, total) != cudaSuccess || cudaHostAlloc(&dst, total, cudaHostAllocPortable) != cudaSuccess ||
      cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking) != cudaSuccess) {
    state.SkipWithError("cannot allocate");
    return;
  }
  cudaMemset(src, 1, total);
  for (auto _ : state) {
    for (std::size_t off = 0; off < total; off += size)
      cudaMemcpyAsync(static_cast<char*>(dst) + off, static_cast<char*>(src) + off, size, cudaMemcpyDeviceToHost,
                      stream);
    cudaStreamSynchronize(stream);
  }
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations() * total));
  cudaStreamDestroy(stream);
  cudaFreeHost(dst);
  cudaFree(src);
}

void BM_EngineD2H(benchmark::State& state) {
  if (!have_gpu(state)) return;
  const auto size = static_cast<std::size_t>(state.range(0));
  const std::size_t total = std::max(size, kPerIteration);
  void* src = nullptr;
  void* spare = nullptr;  // the snapshot of a record larger than the arena
  cudaStream_t stream;
  cudaSetDevice(0);
  if (cudaMalloc(&src, total) != cudaSuccess || cudaMalloc(&spare, total) != cudaSuccess ||
      cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking) != cudaSuccess) {
    state.SkipWithError("cannot allocate");
    return;
  }
  cudaMemset(src, 1, total);
  Staging staging(kStaging, tensortap::Overflow::Block, tensortap::detail::pinned_host_memory());
  std::thread writer([&] {
    while (Staging::Buffer* b = staging.take()) staging.release(b);
  });
  std::atomic<int> errors{0};
  CudaEngineOptions options;
  options.device_bytes = 2 * kStaging;
  CudaEngine engine(staging, options, [&](const std::string& what) {
    if (errors++ == 0) std::fprintf(stderr, "%s\n", what.c_str());
  });
  auto meta = std::make_shared<tensortap::detail::Record>();
  meta->desc.name = "x";
  meta->desc.dtype = *tensortap::detail::dtype_info(c10::ScalarType::Float);
  meta->desc.shape = {static_cast<std::int64_t>(size / 4)};
  meta->desc.nbytes = size;
  std::uint64_t id = 0;
  const auto one_pass = [&] {
    for (std::size_t off = 0; off < total; off += size) {
      auto snap = engine.reserve(0, size, /*may_drop=*/false);
      if (snap->external) snap->data = spare;
      cudaMemcpyAsync(snap->data, static_cast<char*>(src) + off, size, cudaMemcpyDeviceToDevice, stream);
      engine.submit(*snap, stream, tensortap::detail::RecordSpec::of(*meta, id), 4);
      ++id;
    }
    engine.flush();
  };
  // Untimed: the first pass allocates the arena and the pinned staging,
  // creates the events and starts the copier thread (issue 17, item 13).
  one_pass();
  for (auto _ : state) one_pass();
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations() * total));
  const auto c = engine.counters();
  state.counters["records_per_copy"] = c.copies > 0 ? static_cast<double>(c.records) / c.copies : 0.0;
  state.counters["errors"] = errors.load();
  engine.stop();
  staging.stop();
  writer.join();
  cudaStreamDestroy(stream);
  cudaFree(spare);
  cudaFree(src);
}

// BM_RuntimeFloor/<busy>: what the two CUDA runtime calls a capture makes on
// the training thread cost by themselves on this machine: a 4 KiB
// device-to-device cudaMemcpyAsync and a cudaEventRecord, back to back on
// one stream, with nothing else running (busy 0), or beside a thread that
// keeps making runtime calls as the copier does, cudaStreamWaitEvent,
// cudaMemcpyAsync to pinned memory, cudaEventRecord and cudaEventQuery on a
// stream of its own (busy 1); busy 2 times cudaStreamIsCapturing alone, the
// graph check every capture also makes. The floor under BM_CaptureCuda's 20 us target,
// as an upper bound: the loop never waits for the stream, so once the GPU's
// launch queue is full it runs at the device's pace, not the calls'.
void BM_RuntimeFloor(benchmark::State& state) {
  if (!have_gpu(state)) return;
  constexpr std::size_t kBytes = 4096;
  cudaSetDevice(0);
  void *src = nullptr, *dst = nullptr, *host = nullptr;
  cudaStream_t stream, side;
  cudaEvent_t ev, side_ev;
  if (cudaMalloc(&src, 2 * kBytes) != cudaSuccess || cudaHostAlloc(&host, kBytes, cudaHostAllocPortable) != cudaSuccess ||
      cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking) != cudaSuccess ||
      cudaStreamCreateWithFlags(&side, cudaStreamNonBlocking) != cudaSuccess ||
      cudaEventCreateWithFlags(&ev, cudaEventDisableTiming) != cudaSuccess ||
      cudaEventCreateWithFlags(&side_ev, cudaEventDisableTiming) != cudaSuccess) {
    state.SkipWithError("cannot allocate");
    return;
  }
  dst = static_cast<char*>(src) + kBytes;
  std::atomic<bool> stop{false};
  std::thread busy;
  if (state.range(0) == 1)
    busy = std::thread([&] {
      while (!stop.load(std::memory_order_relaxed)) {
        cudaStreamWaitEvent(side, ev, 0);
        cudaMemcpyAsync(host, src, kBytes, cudaMemcpyDeviceToHost, side);
        cudaEventRecord(side_ev, side);
        while (cudaEventQuery(side_ev) == cudaErrorNotReady && !stop.load(std::memory_order_relaxed)) {
        }
      }
    });
  if (state.range(0) == 2) {
    // A capture's third call, the CUDA-graph check, alone (issue 64: cache
    // it per step only if it costs enough).
    cudaStreamCaptureStatus graph = cudaStreamCaptureStatusNone;
    for (auto _ : state) {
      cudaStreamIsCapturing(stream, &graph);
      benchmark::DoNotOptimize(graph);
    }
  } else {
    for (auto _ : state) {
      cudaMemcpyAsync(dst, src, kBytes, cudaMemcpyDeviceToDevice, stream);
      cudaEventRecord(ev, stream);
    }
  }
  stop = true;
  if (busy.joinable()) busy.join();
  cudaStreamSynchronize(stream);
  cudaStreamSynchronize(side);
  cudaEventDestroy(ev);
  cudaEventDestroy(side_ev);
  cudaStreamDestroy(stream);
  cudaStreamDestroy(side);
  cudaFreeHost(host);
  cudaFree(src);
}

}  // namespace

// 4 KiB to 256 MiB, the two benchmarks interleaved size by size so that
// drift (clocks, other processes) hits both alike.
int main(int argc, char** argv) {
  for (std::int64_t s = 4 << 10; s <= (std::int64_t{256} << 20); s *= 4) {
    benchmark::RegisterBenchmark("BM_PinnedMemcpyD2H", BM_PinnedMemcpyD2H)->Arg(s)->UseRealTime()->MinTime(0.5);
    benchmark::RegisterBenchmark("BM_EngineD2H", BM_EngineD2H)->Arg(s)->UseRealTime()->MinTime(0.5);
  }
  benchmark::RegisterBenchmark("BM_RuntimeFloor", BM_RuntimeFloor)->Arg(0)->Arg(1)->Arg(2)->UseRealTime()->MinTime(1.0);
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
