// What capturing costs the training thread.
//
//   build/bench/bench_hot_path
//
// BM_CaptureNotSampled and BM_TapNotSampled: the cost on a step that is not
// sampled. BM_CaptureSampled/<bytes> against BM_Memcpy/<bytes>: the bytes
// per second the training thread moves into staging, with the writer thread
// draining to /dev/shm at the same time, against a plain memcpy.
#include <cstring>
#include <vector>

#include <benchmark/benchmark.h>
#include <torch/nn/modules/container/sequential.h>

#include <tensortap/tensortap.h>

#include "bench_dir.h"

namespace {

void BM_CaptureNotSampled(benchmark::State& state) {
  BenchDir dir;
  tensortap::Recorder rec(tensortap::Options(dir.path + "/run").every(1000000));
  rec.step(1);
  const at::Tensor t = at::ones({256});
  for (auto _ : state) rec.capture("x", t);
}
BENCHMARK(BM_CaptureNotSampled);

void BM_TapNotSampled(benchmark::State& state) {
  BenchDir dir;
  torch::nn::Sequential seq{tensortap::Tap()};
  auto rec = tensortap::watch(*seq, tensortap::Options(dir.path + "/run").every(1000000));
  rec->step(1);
  auto tap = seq->ptr<tensortap::TapImpl>(0);
  const at::Tensor t = at::ones({256});
  for (auto _ : state) benchmark::DoNotOptimize(tap->forward(t));
}
BENCHMARK(BM_TapNotSampled);

void BM_Memcpy(benchmark::State& state) {
  const auto n = static_cast<std::size_t>(state.range(0));
  std::vector<char> src(n, 1), dst(n, 0);
  for (auto _ : state) {
    std::memcpy(dst.data(), src.data(), n);
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations()) * static_cast<std::int64_t>(n));
}

void BM_CaptureSampled(benchmark::State& state) {
  const auto n = static_cast<std::int64_t>(state.range(0));
  BenchDir dir;
  tensortap::Recorder rec(tensortap::Options(dir.path + "/run").buffer_bytes(64 << 20));
  const at::Tensor t = at::ones({n / 4});
  std::int64_t step = 0;
  for (auto _ : state) {
    rec.step(step++);
    rec.capture("x", t);
  }
  rec.close();  // outside the timed loop: the drain is the writer's cost, not the training thread's
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations()) * n);
  state.counters["dropped"] = static_cast<double>(rec.stats().dropped);
}

// 1 KiB to 64 MiB. Iterations are capped: each sampled capture is a file.
BENCHMARK(BM_Memcpy)->RangeMultiplier(8)->Range(1 << 10, 64 << 20);
BENCHMARK(BM_CaptureSampled)->RangeMultiplier(8)->Range(1 << 10, 64 << 20)->Iterations(200)->UseRealTime();

}  // namespace
