// What capturing CUDA tensors costs training, on a GPU (LibTorch with CUDA).
//
//   build/bench/bench_cuda
//
// BM_CaptureCuda/<bytes>/<layout>: the training thread's time per capture()
// of a CUDA tensor (contiguous float32, a strided view, bfloat16), step()
// included; the target is 20 us or less. Everything
// after the snapshot (the copy to the host, the file) is off that thread;
// the staging and device budget are large enough that no capture waits.
// BM_CaptureCudaNaive/<bytes>: the naive way, t.cpu() in the hook, which
// waits for the device and the copy.
//
// BM_TrainMlp/<mode>, BM_TrainCnn/<mode>: time per training step of an MLP
// and a CNN sized for a GPU. mode 0: tensortap off (the model's Taps pass
// through); 1: watch() sampling every 100 steps; 2: every step, every
// gradient and activation. An iteration is 50 steps, then a
// synchronization of the training stream: its own kernels, not the copier's
// copies or the writer's files, which run beside it (flush() comes after
// the timed loop). The device-to-host rate of the engine against
// cudaMemcpyAsync (0.85) is bench_cuda_engine's: through capture() the rate
// would be the writer's and the disk's, not the copy engine's. Modes are interleaved, 3 rounds; the target is a step
// time ratio (mode 1 / mode 0) of 1.03 or less. scripts/gpu.sh prints the ratios.
#include <cmath>
#include <cstdint>
#include <memory>
#include <string>

#include <ATen/cuda/CUDAContext.h>
#include <benchmark/benchmark.h>
#include <torch/cuda.h>
#include <torch/nn/functional/loss.h>
#include <torch/nn/functional/pooling.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/conv.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/sgd.h>

#include <tensortap/tensortap.h>

#include "bench_dir.h"

namespace {

bool have_cuda(benchmark::State& state) {
  if (!torch::cuda::is_available()) {
    state.SkipWithError("no CUDA device");
    return false;
  }
  return true;
}

const torch::Device kGpu(torch::kCUDA, 0);

// Arg 1, the tensor captured: 0 contiguous float32; 1 a strided view (the
// transpose of a square float32 matrix: the snapshot gathers it on the
// device); 2 bfloat16 (widened to float32 on the device).
at::Tensor capture_source(std::int64_t bytes, std::int64_t layout) {
  if (layout == 2) return torch::ones({bytes / 2}, torch::dtype(torch::kBFloat16).device(kGpu));
  if (layout == 1) {
    auto side = static_cast<std::int64_t>(std::sqrt(static_cast<double>(bytes / 4)));
    return torch::ones({side, side}, kGpu).t();
  }
  return torch::ones({bytes / 4}, kGpu);
}

void BM_CaptureCuda(benchmark::State& state) {
  if (!have_cuda(state)) return;
  const auto n = state.range(0);
  BenchDir dir;
  tensortap::Recorder rec(tensortap::Options(dir.path + "/run").buffer_bytes(std::size_t{512} << 20));
  const at::Tensor t = capture_source(n, state.range(1));
  std::int64_t step = 0;
  // Warm-up: the device arena, the events, the pinned staging buffers.
  rec.step(step++);
  rec.capture("x", t);
  rec.flush();
  for (auto _ : state) {
    rec.step(step++);
    rec.capture("x", t);
  }
  rec.close();  // outside the timed loop: the copies and files are not the training thread's
  state.SetBytesProcessed(state.iterations() * static_cast<std::int64_t>(t.nbytes()));
  state.counters["dropped"] = static_cast<double>(rec.counters().dropped);
}

void BM_CaptureCudaNaive(benchmark::State& state) {
  if (!have_cuda(state)) return;
  const at::Tensor t = torch::ones({state.range(0) / 4}, kGpu);
  for (auto _ : state) benchmark::DoNotOptimize(t.detach().cpu());
  state.SetBytesProcessed(state.iterations() * state.range(0));
}

// 4 KiB to 1 MiB; 500 captures fit in the staging buffers and device budget.
BENCHMARK(BM_CaptureCuda)->ArgsProduct({{4 << 10, 64 << 10, 1 << 20}, {0, 1, 2}})->Iterations(500)->UseRealTime();
BENCHMARK(BM_CaptureCudaNaive)->RangeMultiplier(16)->Range(4 << 10, 1 << 20)->UseRealTime();

struct GpuMlpImpl : torch::nn::Module {
  torch::nn::Linear fc1{nullptr}, fc2{nullptr}, fc3{nullptr};
  tensortap::Tap h1, h2;
  GpuMlpImpl() {
    fc1 = register_module("fc1", torch::nn::Linear(1024, 2048));
    h1 = register_module("h1", tensortap::Tap());
    fc2 = register_module("fc2", torch::nn::Linear(2048, 2048));
    h2 = register_module("h2", tensortap::Tap());
    fc3 = register_module("fc3", torch::nn::Linear(2048, 10));
  }
  torch::Tensor forward(torch::Tensor x) {
    x = h1(torch::relu(fc1(x)));
    x = h2(torch::relu(fc2(x)));
    return fc3(x);
  }
};
TORCH_MODULE(GpuMlp);

struct GpuCnnImpl : torch::nn::Module {
  torch::nn::Conv2d c1{nullptr}, c2{nullptr};
  torch::nn::Linear fc{nullptr};
  tensortap::Tap a1, a2;
  GpuCnnImpl() {
    c1 = register_module("c1", torch::nn::Conv2d(torch::nn::Conv2dOptions(3, 64, 3).padding(1)));
    a1 = register_module("a1", tensortap::Tap());
    c2 = register_module("c2", torch::nn::Conv2d(torch::nn::Conv2dOptions(64, 128, 3).padding(1)));
    a2 = register_module("a2", tensortap::Tap());
    fc = register_module("fc", torch::nn::Linear(128 * 8 * 8, 10));
  }
  torch::Tensor forward(torch::Tensor x) {
    namespace F = torch::nn::functional;
    x = F::max_pool2d(a1(torch::relu(c1(x))), F::MaxPool2dFuncOptions(2));
    x = F::max_pool2d(a2(torch::relu(c2(x))), F::MaxPool2dFuncOptions(2));
    return fc(x.flatten(1));
  }
};
TORCH_MODULE(GpuCnn);

constexpr int kStepsPerIteration = 50;

template <class Model>
void train(benchmark::State& state, Model model, const at::Tensor& x, const at::Tensor& y) {
  const auto mode = state.range(0);
  model->to(kGpu);
  torch::optim::SGD opt(model->parameters(), torch::optim::SGDOptions(0.01).momentum(0.9));
  BenchDir dir;
  std::shared_ptr<tensortap::Recorder> rec;
  if (mode > 0)
    rec = tensortap::watch(
        *model, tensortap::Options(dir.path + "/run").every(mode == 1 ? 100 : 1).buffer_bytes(std::size_t{256} << 20));
  std::int64_t step = 0;
  const auto one_step = [&] {
    if (rec) rec->step(step);
    ++step;
    const at::Tensor loss = torch::nn::functional::cross_entropy(model->forward(x), y);
    opt.zero_grad();
    loss.backward();
    opt.step();
  };
  for (int i = 0; i < 20; ++i) one_step();  // warm-up: kernels, allocator, arena
  if (rec) rec->flush();
  torch::cuda::synchronize();
  for (auto _ : state) {
    for (int i = 0; i < kStepsPerIteration; ++i) one_step();
    // The training stream's own work, not the copier's: a device-wide sync
    // or a flush() here would time tensortap's copies and files, which run
    // beside training, not in it.
    at::cuda::getCurrentCUDAStream().synchronize();
  }
  // Untimed: what is still queued must still reach the disk.
  if (rec) rec->flush();
  state.SetItemsProcessed(state.iterations() * kStepsPerIteration);
  state.counters["step_time"] = benchmark::Counter(static_cast<double>(state.iterations() * kStepsPerIteration),
                                                   benchmark::Counter::kIsRate | benchmark::Counter::kInvert);
  if (rec) {
    rec->close();
    state.counters["dropped"] = static_cast<double>(rec->counters().dropped);
  }
}

void BM_TrainMlp(benchmark::State& state) {
  if (!have_cuda(state)) return;
  torch::manual_seed(0);
  train(state, GpuMlp(), torch::randn({512, 1024}, kGpu),
        torch::randint(0, 10, {512}, torch::dtype(torch::kLong).device(kGpu)));
}

void BM_TrainCnn(benchmark::State& state) {
  if (!have_cuda(state)) return;
  torch::manual_seed(0);
  train(state, GpuCnn(), torch::randn({128, 3, 32, 32}, kGpu),
        torch::randint(0, 10, {128}, torch::dtype(torch::kLong).device(kGpu)));
}

}  // namespace

int main(int argc, char** argv) {
  // Modes interleaved round by round, so drift spreads over all of them.
  for (int round = 0; round < 3; ++round)
    for (int mode = 0; mode < 3; ++mode) {
      benchmark::RegisterBenchmark("BM_TrainMlp", BM_TrainMlp)->Arg(mode)->UseRealTime()->MinTime(1.0);
      benchmark::RegisterBenchmark("BM_TrainCnn", BM_TrainCnn)->Arg(mode)->UseRealTime()->MinTime(1.0);
    }
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
